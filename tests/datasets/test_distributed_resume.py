"""Resuming the shard-aware sampler: refused states, exact counts with workers, frameworks."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Sampler

from fastdata.datasets import ResumableDataLoader, ShardAwareDistributedSampler

SIZES = [7, 3, 10, 0, 5, 9, 4, 6, 8, 2]  # 54 samples
TOTAL = sum(SIZES)


def _full(world: int, rank: int, epoch: int, **kwargs: object) -> list[int]:
    sampler = ShardAwareDistributedSampler(SIZES, world, rank, **kwargs)  # type: ignore[arg-type]
    sampler.set_epoch(epoch)
    return sampler.rank_indices().tolist()


@pytest.mark.parametrize(
    ("changed", "match"),
    [
        ({"window_shards": 2}, "saved with window_shards=4, this sampler has window_shards=2"),
        ({"shuffle": False}, "saved with shuffle=True"),
        ({"drop_last": True}, "saved with drop_last=False"),  # 27 per rank either way
        ({"seed": 2}, "saved with seed=1"),
        ({"partition": "fixed"}, "saved with partition='epoch'"),
        ({"world": 3}, "saved with num_replicas=2"),
        ({"sizes": [3, 7, 10, 0, 5, 9, 4, 6, 8, 2]}, "saved with shard_layout="),  # same total
        ({"sizes": [*SIZES, 4]}, "saved with num_samples=27"),  # a longer dataset
    ],
)
def test_a_state_saved_with_other_settings_is_refused(changed: dict, match: str) -> None:
    saved = ShardAwareDistributedSampler(SIZES, 2, 0, seed=1, window_shards=4)
    saved.set_epoch(3)
    iterator = iter(saved)
    for _ in range(11):
        next(iterator)
    state = saved.state_dict()
    kwargs = {"seed": 1, "window_shards": 4, **changed}
    sizes = kwargs.pop("sizes", SIZES)
    world = kwargs.pop("world", 2)
    other = ShardAwareDistributedSampler(sizes, world, 0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match):
        other.load_state_dict(state)


def test_drop_last_is_part_of_the_state() -> None:
    # 54 samples on 4 ranks: 14 with padding, 13 with drop_last
    state = ShardAwareDistributedSampler(SIZES, 4, 0, drop_last=True).state_dict()
    state["num_samples"] = 14  # even where the count agrees, the order would differ
    with pytest.raises(ValueError, match="saved with drop_last=True"):
        ShardAwareDistributedSampler(SIZES, 4, 0).load_state_dict(state)


def test_a_state_from_another_rank_resumes_this_ranks_order() -> None:
    # Lightning saves rank 0's state and loads it on every rank: equal counts make it valid
    saved = ShardAwareDistributedSampler(SIZES, 2, 0, seed=4)
    saved.set_epoch(1)
    state = saved.state_dict(num_consumed=10)
    other = ShardAwareDistributedSampler(SIZES, 2, 1, seed=4)
    other.load_state_dict(state)
    assert list(other) == _full(2, 1, 1, seed=4)[10:]


def test_states_without_the_settings_are_refused() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0)
    state = sampler.state_dict()
    old = {k: state[k] for k in ("seed", "epoch", "num_replicas", "num_samples", "partition")}
    with pytest.raises(ValueError, match=r"state lacks keys \['shuffle', 'drop_last'"):
        sampler.load_state_dict({**old, "num_consumed": 3})
    with pytest.raises(TypeError, match="state must be a mapping"):
        sampler.load_state_dict([1, 2])  # type: ignore[arg-type]


def test_len_is_the_epochs_count_before_during_and_after_a_resume() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 1, seed=3)
    state = sampler.state_dict(num_consumed=20)
    resumed = ShardAwareDistributedSampler(SIZES, 2, 1, seed=3)
    resumed.load_state_dict(state)
    loader = DataLoader(range(TOTAL), batch_size=4, sampler=resumed)
    assert len(resumed) == 27 and len(loader) == 7
    assert sum(len(batch) for batch in loader) == 7  # the resumed epoch: what remains
    for epoch in (1, 2):
        resumed.set_epoch(epoch)
        assert len(loader) == 7
        assert sum(len(batch) for batch in loader) == 27  # later epochs are full


# -- DataLoader workers prefetch: the exact count comes from the loader --------------------
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_loaders_state_is_marked_warned_about_and_refused_alone(num_workers: int) -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 1, 0, seed=2)
    loader = DataLoader(range(TOTAL), batch_size=4, sampler=sampler, num_workers=num_workers)
    iterator = iter(loader)
    next(iterator)
    # handed out: 4 without workers, more with them (prefetched): the sampler cannot tell
    state = sampler.state_dict()
    assert state["position"] == "handed_out" and state["num_consumed"] >= 4
    with pytest.warns(UserWarning, match=r"recorded the \d+ samples handed out"):
        next(iterator)
    fresh = ShardAwareDistributedSampler(SIZES, 1, 0, seed=2)
    fresh.load_state_dict(state)
    with pytest.raises(ValueError, match="records the samples handed out, not those the loop"):
        next(iter(DataLoader(range(TOTAL), batch_size=4, sampler=fresh)))
    # told what the loop consumed: exact, no mark, no warning
    explicit = sampler.state_dict(num_consumed=8)
    assert explicit["num_consumed"] == 8 and "position" not in explicit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iterator)
    fresh.load_state_dict(explicit)
    assert (
        next(iter(DataLoader(range(TOTAL), batch_size=4, sampler=fresh))).tolist()
        == (_full(1, 0, 0, seed=2)[8:12])
    )
    del iterator


def test_a_loader_that_prefetches_any_other_way_is_not_trusted_either() -> None:
    # a prefetching loop built on no torch class at all: nothing to recognise it by
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=3)
    batches = iter(BatchSampler(sampler, 4, drop_last=False))
    prefetched = [next(batches) for _ in range(3)]  # three batches ahead of the loop
    consumed = prefetched.pop(0)
    state = sampler.state_dict()
    assert state["num_consumed"] == 12 and state["position"] == "handed_out"
    assert sampler.state_dict(num_consumed=len(consumed))["num_consumed"] == 4


def test_state_at_the_top_of_an_epoch_and_after_a_load_needs_no_report() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=3)
    assert "position" not in sampler.state_dict()  # nothing handed out yet
    sampler.load_state_dict(sampler.state_dict(num_consumed=8))
    assert sampler.state_dict() == sampler.state_dict(num_consumed=8)  # the loaded position


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumable_loader_saves_what_the_loop_took(num_workers: int) -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 1, seed=6)
    sampler.set_epoch(2)
    loader = (
        ResumableDataLoader(
            range(TOTAL), batch_size=4, sampler=sampler, num_workers=num_workers, prefetch_factor=3
        )
        if num_workers
        else ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler)
    )
    head: list[int] = []
    for step, batch in enumerate(loader):
        head += batch.tolist()
        if step == 2:
            break
    state = loader.state_dict()
    assert state["sampler"]["num_consumed"] == 12 and state["num_batches"] == 3
    assert sampler.state_dict()["num_consumed"] == 12  # the sampler asks the loader
    state = pickle.loads(pickle.dumps(state))

    fresh = ShardAwareDistributedSampler(SIZES, 2, 1, seed=6)
    resumed = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=fresh)
    resumed.load_state_dict(state)
    tail = [i for batch in resumed for i in batch.tolist()]
    assert head + tail == _full(2, 1, 2, seed=6)
    assert resumed.state_dict()["sampler"]["num_consumed"] == 27  # the epoch is done
    fresh.set_epoch(3)
    assert [i for batch in resumed for i in batch.tolist()] == _full(2, 1, 3, seed=6)


def test_resumable_loader_with_a_batch_sampler_and_other_samplers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 1, 0)
    loader = ResumableDataLoader(range(TOTAL), batch_sampler=BatchSampler(sampler, 5, False))
    iterator = iter(loader)
    next(iterator), next(iterator)
    assert loader.state_dict()["sampler"]["num_consumed"] == 10
    plain = ResumableDataLoader(range(10), batch_size=2)
    assert plain.state_dict() == {"sampler": None, "num_batches": 0, "epoch": None}
    plain.load_state_dict({"sampler": None, "num_batches": 2})
    assert "restarts from its beginning" in caplog.text
    with pytest.raises(TypeError, match="state must be the mapping"):
        plain.load_state_dict({"num_consumed": 3})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_exactly(num_workers: int) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    kwargs = {"num_workers": num_workers}
    if num_workers:
        kwargs["prefetch_factor"] = 3
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=8)
    sampler.set_epoch(1)
    loader = stateful.StatefulDataLoader(range(TOTAL), batch_size=4, sampler=sampler, **kwargs)
    head: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, batch in enumerate(loader):
            head += batch.tolist()
            if step == 3:
                break
        state = loader.state_dict()
    # it saves the sampler's iterator with the sampler: the position is confirmed
    assert not [w for w in caught if "handed out" in str(w.message)]
    fresh = ShardAwareDistributedSampler(SIZES, 2, 0, seed=8)
    resumed = stateful.StatefulDataLoader(range(TOTAL), batch_size=4, sampler=fresh, **kwargs)
    resumed.load_state_dict(state)
    assert len(resumed) == 7
    tail = [i for batch in resumed for i in batch.tolist()]
    assert head + tail == _full(2, 0, 1, seed=8)
    fresh.set_epoch(2)
    assert [i for batch in resumed for i in batch.tolist()] == _full(2, 0, 2, seed=8)


# -- frameworks that shard again ---------------------------------------------------------
def test_is_a_distributed_sampler_so_lightning_does_not_wrap_it() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0)
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (2, 0, 27)


class _EveryOtherBatch(Sampler[list[int]]):
    """What a framework does to split a DataLoader's batches between 2 processes."""

    def __init__(self, batches: Sampler[list[int]], rank: int) -> None:
        self.batches, self.rank = batches, rank

    def __iter__(self) -> Iterator[list[int]]:
        return (b for k, b in enumerate(self.batches) if k % 2 == self.rank)

    def __len__(self) -> int:
        return len(self.batches) // 2  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["BatchSamplerShard", "RenamedShard"])
def test_a_loader_rebuilt_around_the_sampler_is_refused_whatever_its_names(name: str) -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0)
    loader = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler)
    resharding = type(name, (_EveryOtherBatch,), {})(loader.batch_sampler, 0)
    rebuilt = DataLoader(range(TOTAL), batch_sampler=resharding)
    with pytest.raises(ValueError, match=r"another loader built around it iterates it"):
        next(iter(rebuilt))
    # the loader it was given to reads this rank's share
    assert [i for b in loader for i in b.tolist()] == _full(2, 0, 0)


def test_accelerate_prepare_of_the_loader_is_refused() -> None:
    accelerate = pytest.importorskip("accelerate")
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0)
    loader = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler)
    prepared = accelerate.data_loader.prepare_data_loader(
        loader, num_processes=2, process_index=0, put_on_device=False
    )
    with pytest.raises(ValueError, match=r"accelerator.prepare\(dataloader\)"):
        next(iter(prepared))
    assert [i for b in loader for i in b.tolist()] == _full(2, 0, 0)


def test_lightning_keeps_the_sampler_and_a_rebuilt_loader_serves_it() -> None:
    data = pytest.importorskip("lightning.pytorch.utilities.data")
    sampler = ShardAwareDistributedSampler(SIZES, 2, 1)
    loader = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler, num_workers=0)
    # what Lightning does when it re-instantiates a DataLoader (overfit, predict)
    rebuilt = data._update_dataloader(loader, sampler)
    assert type(rebuilt) is ResumableDataLoader and rebuilt.sampler is sampler
    head = []
    for step, batch in enumerate(rebuilt):
        head += batch.tolist()
        if step == 1:
            break
    assert rebuilt.state_dict()["sampler"]["num_consumed"] == 8
    assert head == _full(2, 1, 0)[:8]


def test_one_process_lets_another_loader_iterate_without_its_count() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 1, 0)
    loader = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler)
    next(iter(loader))
    other = iter(DataLoader(range(TOTAL), batch_size=4, sampler=sampler))
    next(other), next(other)
    assert sampler.state_dict()["position"] == "handed_out"  # not the first loader's 4


def test_the_sampler_pickles_while_a_loader_is_attached() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 1, 0)
    loader = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler)
    next(iter(loader))
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.state_dict()["num_consumed"] == 4
    assert np.array_equal(copy.rank_indices(), sampler.rank_indices())
    assert torch.utils.data.get_worker_info() is None


# -- a loaded state is checked, not coerced ------------------------------------------------
@pytest.mark.parametrize(
    ("key", "bad", "error", "match"),
    [
        ("num_consumed", 2.7, TypeError, r"num_consumed must be an int, got 2.7 \(float\)"),
        ("num_consumed", "10", TypeError, r"num_consumed must be an int, got '10' \(str\)"),
        ("num_consumed", True, TypeError, r"num_consumed must be an int, got True \(bool\)"),
        ("num_consumed", 2**70, ValueError, r"num_consumed must be in \[0, 27\], got 1180"),
        ("num_consumed", -1, ValueError, r"num_consumed must be in \[0, 27\], got -1"),
        ("epoch", "1", TypeError, r"epoch must be an int, got '1' \(str\)"),
        ("epoch", 1.9, TypeError, r"epoch must be an int, got 1.9 \(float\)"),
        ("epoch", False, TypeError, r"epoch must be an int, got False \(bool\)"),
        ("epoch", 2**70, ValueError, r"epoch must be in \[0, 9223372036854775807\], got 1180"),
        ("epoch", -1, ValueError, r"epoch must be in \[0, 9223372036854775807\], got -1"),
        ("seed", True, TypeError, r"seed must be an int, got True \(bool\)"),
        ("seed", 1.0, TypeError, r"seed must be an int, got 1.0 \(float\)"),
        ("shuffle", 1, TypeError, r"shuffle must be a bool, got 1 \(int\)"),
        ("consumed_after", [[3, 5]], ValueError, r"consumed_after start must be in \[5, 26\]"),
        ("consumed_after", [[8, 8]], ValueError, r"consumed_after stop must be in \[9, 27\]"),
        ("consumed_after", [[8, 10], [11, 28]], ValueError, r"stop must be in \[12, 27\], got 28"),
        ("consumed_after", [[8, 10], [10, 12]], ValueError, r"start must be in \[11, 26\]"),
        ("consumed_after", [[8.0, 10]], TypeError, r"consumed_after start must be an int"),
        ("consumed_after", [8, 10], TypeError, r"consumed_after must be a list of \[start, stop\]"),
        ("consumed_after", "8-10", TypeError, r"consumed_after must be a list of \[start, stop\]"),
    ],
)
def test_a_state_with_a_value_of_the_wrong_type_or_range_is_refused(
    key: str, bad: object, error: type[Exception], match: str
) -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=1)
    state = sampler.state_dict(num_consumed=4)
    with pytest.raises(error, match=match):
        sampler.load_state_dict({**state, key: bad})
    loader = ResumableDataLoader(range(TOTAL), batch_size=4, sampler=sampler)
    with pytest.raises(error, match=match):
        loader.load_state_dict({"sampler": {**state, key: bad}, "num_batches": 1})
    # nothing loaded (the loader iterates: the sampler serves it alone)
    assert sampler.epoch == 0 and [i for b in loader for i in b.tolist()] == _full(2, 0, 0, seed=1)


def test_numpy_ints_are_ints_and_num_consumed_is_checked_when_saving() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=1)
    state = sampler.state_dict(num_consumed=np.int64(4))
    sampler.load_state_dict({**state, "epoch": np.int64(3), "num_consumed": np.int32(8)})
    assert sampler.epoch == 3 and list(sampler) == _full(2, 0, 3, seed=1)[8:]
    with pytest.raises(TypeError, match=r"num_consumed must be an int, got 2.7 \(float\)"):
        sampler.state_dict(num_consumed=2.7)  # type: ignore[arg-type]
