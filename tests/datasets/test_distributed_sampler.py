from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from fastdata.datasets import RAMDataset, ShardDataset, passthrough_collate
from fastdata.datasets.distributed import ShardAwareDistributedSampler, shard_sizes_of
from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, save_manifest
from fastdata.shards.reader import CacheRoom
from tests.datasets.conftest import Reference

SIZES = [7, 3, 10, 0, 5, 9, 4, 6, 8, 2]  # 54 samples, uneven shards, one empty


def _ranks(sizes: list[int], world: int, epoch: int = 0, **kwargs: object) -> list[np.ndarray]:
    out = []
    for rank in range(world):
        sampler = ShardAwareDistributedSampler(sizes, world, rank, **kwargs)  # type: ignore[arg-type]
        sampler.set_epoch(epoch)
        out.append(np.array(list(sampler)))
    return out


def _shard_of(index: int, sizes: list[int]) -> int:
    return int(np.searchsorted(np.cumsum(sizes), index, side="right"))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("shuffle", [True, False])
def test_union_is_the_dataset_once_with_padding_rule(world: int, shuffle: bool) -> None:
    total = sum(SIZES)
    for epoch in (0, 1):
        parts = _ranks(SIZES, world, epoch, shuffle=shuffle, seed=3)
        per_rank = -(-total // world)
        assert [len(p) for p in parts] == [per_rank] * world
        counts = Counter(np.concatenate(parts).tolist())
        assert set(counts) == set(range(total))
        # padding repeats the first samples of the epoch's global order, fewer than `world`
        assert sum(c - 1 for c in counts.values()) == per_rank * world - total
        assert max(counts.values()) <= 2


@pytest.mark.parametrize("world", [2, 4, 5, 7])
def test_drop_last_sees_every_kept_sample_once(world: int) -> None:
    total = sum(SIZES)
    parts = _ranks(SIZES, world, 1, drop_last=True)
    assert [len(p) for p in parts] == [total // world] * world
    seen = np.concatenate(parts)
    assert len(set(seen.tolist())) == len(seen) == total - total % world


def test_order_is_the_same_global_sequence_whatever_the_world_size() -> None:
    sizes = [6] * 10
    one = _ranks(sizes, 1, epoch=2, seed=11)[0]
    for world in (2, 3, 4, 5):
        np.testing.assert_array_equal(np.concatenate(_ranks(sizes, world, epoch=2, seed=11)), one)
    np.testing.assert_array_equal(_ranks(sizes, 1, epoch=2, seed=11)[0], one)
    assert not np.array_equal(_ranks(sizes, 1, epoch=3, seed=11)[0], one)
    assert not np.array_equal(_ranks(sizes, 1, epoch=2, seed=12)[0], one)
    assert sorted(one.tolist()) != one.tolist()  # it is shuffled


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fixed_partition_keeps_each_ranks_samples_across_epochs(world: int) -> None:
    total = sum(SIZES)
    epochs = [_ranks(SIZES, world, epoch, seed=9, partition="fixed") for epoch in range(3)]
    for rank in range(world):
        sets = [sorted(parts[rank].tolist()) for parts in epochs]
        assert sets[0] == sets[1] == sets[2]  # same samples every epoch...
        assert epochs[0][rank].tolist() != epochs[1][rank].tolist()  # ...reshuffled
    counts = Counter(np.concatenate(epochs[1]).tolist())
    assert set(counts) == set(range(total))
    assert sum(counts.values()) == -(-total // world) * world
    # a rank's partition is made of whole shards but at its two ends
    sizes = [10] * 12
    for part in _ranks(sizes, 3, 2, partition="fixed"):
        assert sum(1 for n in Counter(i // 10 for i in part.tolist()).values() if n < 10) <= 2


def test_unshuffled_order_is_storage_order() -> None:
    parts = _ranks(SIZES, 2, shuffle=False)
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(sum(SIZES)))


def test_each_rank_reads_mostly_whole_shards() -> None:
    sizes = [50] * 32
    for window in (1, 4):
        parts = _ranks(sizes, 4, epoch=5, window_shards=window)
        for part in parts:
            shards = Counter(_shard_of(i, sizes) for i in part.tolist())
            whole = sum(1 for n in shards.values() if n == 50)
            assert whole >= 8 - 2 * window  # 8 shards' worth per rank
            assert len(shards) <= 8 + 2 * window
        # samples inside a window are mixed: a batch spans several shards
        if window == 4:
            assert len({_shard_of(i, sizes) for i in parts[0][:32].tolist()}) > 1


def test_resume_mid_epoch_neither_repeats_nor_skips() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 3, 1, seed=5)
    sampler.set_epoch(4)
    full = list(sampler)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(7)]
    state = sampler.state_dict(num_consumed=len(head))
    assert state["num_consumed"] == 7 and state["epoch"] == 4

    resumed = ShardAwareDistributedSampler(SIZES, 3, 1, seed=5)
    resumed.load_state_dict(state)
    resumed.set_epoch(4)  # the usual loop calls set_epoch with the saved epoch: no effect
    # len() is the epoch's per-rank count, as torchdata's StatefulDistributedSampler: a
    # framework that reads it once per epoch must not cut later epochs short
    assert len(resumed) == len(full) == 18
    assert head + list(resumed) == full  # the resumed epoch yields only what remains
    assert len(resumed) == len(full)
    resumed.set_epoch(5)
    assert len(resumed) == len(full)
    expected = ShardAwareDistributedSampler(SIZES, 3, 1, seed=5)
    expected.set_epoch(5)
    assert list(resumed) == list(expected)


def test_resume_with_explicit_consumed_count_through_a_dataloader() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=1)
    loader = DataLoader(range(sum(SIZES)), batch_size=4, sampler=sampler)
    assert len(loader) == 7  # ceil(27 / 4): the same on every rank
    batches = []
    for batch in loader:
        batches.append(batch.tolist())
        if len(batches) == 3:
            break
    state = sampler.state_dict(num_consumed=3 * 4)
    resumed = ShardAwareDistributedSampler(SIZES, 2, 0, seed=1)
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in DataLoader(range(sum(SIZES)), batch_size=4, sampler=resumed)]
    flat = [i for b in batches + rest for i in b]
    assert flat == sampler.rank_indices().tolist()


def test_shard_sizes_from_folder_reader_manifest_and_attribute(tmp_path: Path) -> None:
    fields = [FieldSpec("label", "array", "int64")]
    shards = []
    for number, count in enumerate([3, 0, 2]):
        with ShardWriter(tmp_path / f"shard-{number:05d}.h5", fields) as writer:
            for i in range(count):
                writer.append({"label": i})
            shards.append(writer.close())
    manifest = Manifest(fields=fields, shards=shards)
    save_manifest(tmp_path, manifest)

    class Sized:
        shard_sizes = (3, 0, 2)

    for source in (tmp_path, str(tmp_path), ShardReader(tmp_path), manifest, Sized(), [3, 0, 2]):
        assert shard_sizes_of(source) == [3, 0, 2]
    assert shard_sizes_of(ShardDataset(tmp_path, fields=("label",))) == [3, 0, 2]
    assert shard_sizes_of(TensorDataset(torch.zeros(5))) == [5]  # other datasets: one shard


def test_empty_and_tiny_datasets() -> None:
    assert [len(p) for p in _ranks([0, 0], 2)] == [0, 0]
    parts = _ranks([1], 4)  # fewer samples than ranks: everyone gets the one sample
    assert [p.tolist() for p in parts] == [[0]] * 4
    assert [len(p) for p in _ranks([1], 4, drop_last=True)] == [0] * 4


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="dataset must have a `shard_sizes`"):
        ShardAwareDistributedSampler(object(), 1, 0)
    with pytest.raises(ValueError, match="shard sizes must be >= 0"):
        ShardAwareDistributedSampler([3, -1], 1, 0)
    with pytest.raises(ValueError, match="num_replicas and rank must be given"):
        ShardAwareDistributedSampler(SIZES)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        ShardAwareDistributedSampler(SIZES, 2, 2)
    with pytest.raises(ValueError, match="num_replicas must be >= 1, got 0"):
        ShardAwareDistributedSampler(SIZES, 0, 0)
    with pytest.raises(TypeError, match="rank must be an int"):
        ShardAwareDistributedSampler(SIZES, 2, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window_shards must be >= 1, got 0"):
        ShardAwareDistributedSampler(SIZES, 1, 0, window_shards=0)
    with pytest.raises(TypeError, match="window_shards must be an int"):
        ShardAwareDistributedSampler(SIZES, 1, 0, window_shards=2.0)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"partition must be one of .*'epoch', 'fixed'.*got 'node'"
    ):
        ShardAwareDistributedSampler(SIZES, 1, 0, partition="node")
    with pytest.raises(TypeError, match="seed must be an int"):
        ShardAwareDistributedSampler(SIZES, 1, 0, seed="0")  # type: ignore[arg-type]


def test_bad_states_are_refused() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=1)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match=r"state lacks keys \['epoch'\]"):
        sampler.load_state_dict({k: v for k, v in state.items() if k != "epoch"})
    with pytest.raises(ValueError, match="saved with partition='fixed'"):
        sampler.load_state_dict({**state, "partition": "fixed"})
    with pytest.raises(ValueError, match="saved with num_replicas=3"):
        sampler.load_state_dict({**state, "num_replicas": 3})
    with pytest.raises(ValueError, match="saved with seed=2"):
        sampler.load_state_dict({**state, "seed": 2})
    with pytest.raises(ValueError, match=r"num_consumed must be in \[0, 27\], got 28"):
        sampler.load_state_dict({**state, "num_consumed": 28})
    with pytest.raises(ValueError, match=r"num_consumed must be in \[0, 27\], got -1"):
        sampler.state_dict(num_consumed=-1)


def test_fastdata_datasets_work_with_torch_distributed_sampler(raw_shards: Reference) -> None:
    datasets = [
        ShardDataset(raw_shards.path, fields=("label",)),
        RAMDataset.from_shards(raw_shards.path, fields=("label",), show_progress=False),
    ]
    for dataset in datasets:
        seen = []
        for rank in (0, 1):
            sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, seed=3)
            loader = DataLoader(dataset, 4, sampler=sampler, collate_fn=passthrough_collate)
            seen += [int(label) for batch in loader for label in batch]
        assert sorted(seen) == sorted(raw_shards.labels.tolist())


class _CappedSet:
    """What the sampler reads of a remote set behind a cache holding ``shards`` of its
    largest shards (100 bytes each)."""

    def __init__(self, shards: int) -> None:
        self.shard_sizes = SIZES
        self.cache_room = CacheRoom(limit_bytes=shards * 100 + 99, shard_bytes=100)


@pytest.mark.parametrize(
    ("shards", "window"), [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2), (7, 3), (8, 3), (9, 4)]
)
def test_the_window_shrinks_to_twice_what_the_cache_holds_with_a_spare(
    shards: int, window: int
) -> None:
    """The cache keeps twice the shards shuffled together and a spare: 2w + 1 <= shards
    (at least one); the order is then exactly the one asked with that window, on every
    rank."""
    capped = _CappedSet(shards)
    if window < 4:
        with pytest.warns(UserWarning, match=rf"holds {shards} shards? of the set: the "
                          rf"sampler shuffles {window} shards? together instead of "
                          r"window_shards=4"):  # fmt: skip
            samplers = [ShardAwareDistributedSampler(capped, 3, r, seed=4) for r in range(3)]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            samplers = [ShardAwareDistributedSampler(capped, 3, r, seed=4) for r in range(3)]
    for rank, sampler in enumerate(samplers):
        assert sampler.window_shards == window
        asked = ShardAwareDistributedSampler(SIZES, 3, rank, seed=4, window_shards=window)
        assert sampler.rank_indices(2).tolist() == asked.rank_indices(2).tolist()


def test_a_cache_below_three_shards_says_shards_come_again() -> None:
    with pytest.warns(UserWarning, match=r"even so its order keeps 3 in use, more than the "
                      r"cache holds .*: shards are downloaded more than once an epoch; allow "
                      r"900 bytes to shuffle 4 together$"):  # fmt: skip
        ShardAwareDistributedSampler(_CappedSet(2), 1, 0)


@pytest.mark.parametrize("settings", [{"shuffle": False}, {"partition": "fixed"}])
def test_an_order_without_shuffled_windows_keeps_its_window(settings: dict[str, object]) -> None:
    """Unshuffled, or each rank permuting its own samples: the window shapes no reads."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = ShardAwareDistributedSampler(_CappedSet(2), 1, 0, **settings)  # type: ignore[arg-type]
    assert sampler.window_shards == 4
