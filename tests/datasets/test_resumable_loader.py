"""ResumableDataLoader: a resumed run yields exactly what the uninterrupted run would have,
whatever the DataLoader settings, across two resumes in one epoch and top-of-epoch states."""

from __future__ import annotations

import inspect
import multiprocessing
import pickle
from dataclasses import dataclass
from typing import Any

import cv2
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, get_worker_info

from fastdata.datasets import ResumableDataLoader, ShardAwareDistributedSampler

SIZES = [7, 3, 10, 0, 5, 9, 4, 6, 8, 2]  # 54 samples, 27 per rank on 2 ranks
TOTAL = sum(SIZES)
EPOCH = 2
_FORK = multiprocessing.get_context("fork")
HAS_IN_ORDER = "in_order" in inspect.signature(DataLoader).parameters


class Items(Dataset[int]):
    """Sample ``i`` is ``i``. With a gate, worker 0's first read waits until the test opens
    it, so that worker 1's first batch (batch 1) reaches the loop before batch 0."""

    def __init__(self, gate: Any = None) -> None:
        self.gate = gate
        self.waited = False

    def __len__(self) -> int:
        return TOTAL

    def __getitem__(self, index: int) -> int:
        info = get_worker_info()
        if self.gate is not None and info is not None and info.id == 0 and not self.waited:
            self.waited = True
            self.gate.wait(timeout=120)  # a bound against a hang, not a timing margin
        return index


@dataclass(frozen=True)
class Settings:
    """DataLoader settings, and the batch size of each of the three runs of an epoch."""

    num_workers: int = 0
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    in_order: bool = True
    drop_last: bool = False
    batch_sizes: tuple[int, int, int] = (4, 4, 4)
    batch_sampler: bool = False

    def loader(self, batch_size: int, gate: Any = None) -> ResumableDataLoader:
        sampler = ShardAwareDistributedSampler(SIZES, 2, 1, seed=6)
        sampler.set_epoch(EPOCH)
        kwargs: dict[str, Any] = {}
        if self.num_workers:
            kwargs = {
                "num_workers": self.num_workers,
                "persistent_workers": self.persistent_workers,
                "prefetch_factor": self.prefetch_factor,
                "multiprocessing_context": _FORK,
            }
            if not self.in_order:
                if not HAS_IN_ORDER:
                    pytest.skip("DataLoader(in_order=...) needs torch >= 2.6")
                kwargs["in_order"] = False
        if self.batch_sampler:
            batches = BatchSampler(sampler, batch_size, self.drop_last)
            return ResumableDataLoader(Items(gate), batch_sampler=batches, **kwargs)
        return ResumableDataLoader(
            Items(gate), batch_size=batch_size, sampler=sampler, drop_last=self.drop_last, **kwargs
        )

    def gate(self) -> Any:
        """An event that holds batch 0 back, where batches may overtake each other."""
        return _FORK.Event() if self.num_workers and not self.in_order else None


MATRIX = {
    "no-workers": Settings(),
    "no-workers-drop-last-batch-sampler": Settings(drop_last=True, batch_sampler=True),
    "no-workers-batch-size-changes": Settings(batch_sizes=(4, 5, 3)),
    "workers": Settings(num_workers=2, prefetch_factor=2),
    "persistent-drop-last": Settings(
        num_workers=2, persistent_workers=True, prefetch_factor=1, drop_last=True
    ),
    "workers-batch-size-changes": Settings(num_workers=2, prefetch_factor=1, batch_sizes=(3, 6, 4)),
    "out-of-order-batch-size-changes": Settings(
        num_workers=2, prefetch_factor=3, in_order=False, batch_sizes=(4, 5, 3)
    ),
    "out-of-order-persistent-drop-last": Settings(
        num_workers=2, persistent_workers=True, prefetch_factor=2, in_order=False, drop_last=True
    ),
    "out-of-order-persistent-batch-sampler": Settings(
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=3,
        in_order=False,
        batch_sampler=True,
    ),
}


def _take(iterator: Any, count: int, gate: Any) -> list[int]:
    """The samples of the next ``count`` batches; the gate opens once the first arrived."""
    taken: list[int] = []
    for _ in range(count):
        taken += next(iterator).tolist()
        if gate is not None:
            gate.set()
    return taken


def _rest(loader: ResumableDataLoader) -> list[int]:
    return [i for batch in loader for i in batch.tolist()]


@pytest.mark.parametrize("settings", MATRIX.values(), ids=MATRIX.keys())
def test_two_resumes_in_one_epoch_yield_the_uninterrupted_runs_samples(settings: Settings) -> None:
    first_size, second_size, third_size = settings.batch_sizes
    same_size = first_size == second_size == third_size
    reference = settings.loader(first_size)
    uninterrupted = _rest(reference)
    order = reference._shard_sampler().rank_indices().tolist()  # type: ignore[union-attr]
    if same_size:
        expected = uninterrupted
    else:  # drop_last=False: the whole epoch, in its order
        assert not settings.drop_last
        expected = order

    gate = settings.gate()
    first = settings.loader(first_size, gate)
    head = _take(iter(first), 1, gate)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    del first

    gate = settings.gate()
    second = settings.loader(second_size, gate)
    second.load_state_dict(state)
    middle = _take(iter(second), 2, gate)
    state = pickle.loads(pickle.dumps(second.state_dict()))

    if third_size == second_size:  # the same loader (and persistent workers) goes on
        third = second
    else:
        del second
        third = settings.loader(third_size)
    third.load_state_dict(state)
    tail = _rest(third)

    resumed = head + middle + tail
    if settings.in_order:
        assert resumed == expected
    else:  # batches overtake each other: the same samples, each once
        assert sorted(resumed) == sorted(expected)
    final = third.state_dict()["sampler"]  # the epoch is done: all it yields, consumed
    assert (final["num_consumed"], final["consumed_after"]) == (len(expected), [])

    sampler = third._shard_sampler()
    assert sampler is not None
    sampler.set_epoch(EPOCH + 1)  # later epochs are whole
    next_epoch = _rest(third)
    assert sorted(next_epoch) == sorted(sampler.rank_indices().tolist()[: len(next_epoch)])
    assert len(next_epoch) == (27 // third_size * third_size if settings.drop_last else 27)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("broken_after", [None, 2], ids=["finished", "broken-off"])
def test_a_state_taken_after_set_epoch_resumes_the_whole_next_epoch(
    num_workers: int, broken_after: int | None
) -> None:
    settings = Settings(num_workers=num_workers, prefetch_factor=2 if num_workers else None)
    loader = settings.loader(10)
    sampler = loader._shard_sampler()
    assert sampler is not None
    for step, _ in enumerate(loader):
        if step + 1 == broken_after:
            break
    sampler.set_epoch(EPOCH + 1)
    state = loader.state_dict()  # a top-of-epoch checkpoint: nothing of epoch 3 consumed
    assert (state["sampler"]["epoch"], state["sampler"]["num_consumed"]) == (EPOCH + 1, 0)
    assert state["num_batches"] == 0
    assert sampler.state_dict()["num_consumed"] == 0

    resumed = settings.loader(10)
    resumed.load_state_dict(state)
    assert _rest(resumed) == sampler.rank_indices().tolist()  # all 27 of epoch 3


def test_out_of_order_batches_are_recorded_as_such() -> None:
    settings = MATRIX["out-of-order-batch-size-changes"]
    gate = settings.gate()
    loader = settings.loader(4, gate)
    taken = _take(iter(loader), 1, gate)
    order = ShardAwareDistributedSampler(SIZES, 2, 1, seed=6).rank_indices(EPOCH).tolist()
    assert taken == order[4:8]  # batch 1 overtook batch 0
    state = loader.state_dict()["sampler"]
    assert (state["num_consumed"], state["consumed_after"]) == (0, [[4, 8]])
    sampler = loader._shard_sampler()
    assert sampler is not None and sampler.state_dict() == state  # the sampler agrees


def test_a_batch_sampler_that_reorders_across_batches_makes_the_state_refuse() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 1, 0, shuffle=False)

    class Reversed(BatchSampler):
        def __iter__(self) -> Any:
            return reversed(list(super().__iter__()))

    loader = ResumableDataLoader(Items(), batch_sampler=Reversed(sampler, 5, False))
    next(iter(loader))
    with pytest.raises(ValueError, match="batch 0 does not hold the sampler's next 4 indices"):
        loader.state_dict()


def test_hold_back_leaves_batches_read_ahead_out_of_the_state() -> None:
    sampler = ShardAwareDistributedSampler(SIZES, 1, 0, seed=1)
    loader = ResumableDataLoader(Items(), batch_size=5, sampler=sampler)
    iterator = iter(loader)
    held = [1]
    loader.hold_back(lambda: held[0])
    next(iterator), next(iterator), next(iterator)
    state = loader.state_dict()
    assert (state["num_batches"], state["sampler"]["num_consumed"]) == (2, 10)
    assert sampler.state_dict()["num_consumed"] == 10
    held[0] = 99
    with pytest.raises(ValueError, match=r"count\(\) must be in \[0, 3\], got 99"):
        loader.state_dict()


def test_num_batches_must_be_an_int() -> None:
    loader = Settings().loader(4)
    state = loader.state_dict()
    for bad in ("3", 2.5, True):
        with pytest.raises(TypeError, match="num_batches must be an int"):
            loader.load_state_dict({**state, "num_batches": bad})
    with pytest.raises(TypeError, match=r"state\['sampler'\] must be a mapping or None"):
        loader.load_state_dict({**state, "sampler": [1, 2]})
    assert torch.utils.data.get_worker_info() is None


def _train(loader: ResumableDataLoader, log: list[tuple[int, int]], saves: list[Any]) -> None:
    """The DDP guide's loop, with a checkpoint when each epoch starts (as callbacks take it)
    and every 3 steps; ``log`` gets ``(epoch, sample)`` per sample consumed."""
    sampler = loader._shard_sampler()
    assert sampler is not None
    for epoch in range(sampler.epoch, 3):
        sampler.set_epoch(epoch)
        saves.append((pickle.dumps(loader.state_dict()), len(log)))
        for step, batch in enumerate(loader):
            log += [(epoch, i) for i in batch.tolist()]
            if step % 3 == 0:
                saves.append((pickle.dumps(loader.state_dict()), len(log)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_readme_loop_resumes_exactly_from_every_checkpoint(num_workers: int) -> None:
    settings = Settings(
        num_workers=num_workers,
        persistent_workers=bool(num_workers),
        prefetch_factor=2 if num_workers else None,
    )
    reference: list[tuple[int, int]] = []
    saves: list[Any] = []
    first = settings.loader(4)
    first._shard_sampler().set_epoch(0)  # type: ignore[union-attr]
    _train(first, reference, saves)
    assert len(reference) == 3 * 27 and len(saves) == 3 * (1 + 3)
    for saved, done in saves:
        resumed = settings.loader(4)
        resumed.load_state_dict(pickle.loads(saved))
        rest: list[tuple[int, int]] = []
        _train(resumed, rest, [])
        assert rest == reference[done:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_without_batching_each_sample_is_a_batch(num_workers: int) -> None:
    def loader() -> ResumableDataLoader:
        sampler = ShardAwareDistributedSampler(SIZES, 2, 0, seed=5)
        return ResumableDataLoader(
            Items(), batch_size=None, sampler=sampler, num_workers=num_workers
        )

    first = loader()
    iterator = iter(first)
    head = [int(next(iterator)) for _ in range(5)]
    state = first.state_dict()
    assert (state["sampler"]["num_consumed"], state["num_batches"]) == (5, 5)
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    order = ShardAwareDistributedSampler(SIZES, 2, 0, seed=5).rank_indices().tolist()
    assert head + [int(i) for i in resumed] == order


@pytest.mark.parametrize(
    "settings",
    [Settings(), Settings(num_workers=2), Settings(num_workers=2, in_order=False)],
    ids=["no-workers", "workers", "out-of-order"],
)
@pytest.mark.parametrize("sharded", [True, False], ids=["shard-sampler", "shuffle"])
def test_last_batch_indices_are_those_of_the_batch_handed_out(
    settings: Settings, sharded: bool
) -> None:
    if sharded:
        loader = settings.loader(4)
    else:  # any sampler: a plain shuffle
        kwargs: dict[str, Any] = {"num_workers": settings.num_workers}
        if settings.num_workers:
            kwargs["multiprocessing_context"] = _FORK
        if not settings.in_order:
            if not HAS_IN_ORDER:
                pytest.skip("DataLoader(in_order=...) needs torch >= 2.6")
            kwargs["in_order"] = False
        loader = ResumableDataLoader(Items(), batch_size=4, shuffle=True, **kwargs)
    assert loader.last_batch_indices() is None
    seen = []
    for batch in loader:  # sample i is i: each batch holds its own indices
        assert loader.last_batch_indices() == list(batch)
        seen.extend(batch)
    assert seen != sorted(seen)  # shuffled: the indices are not the batch positions


class OpenCVThreads(Dataset[int]):
    """Sample ``i`` is the number of threads OpenCV runs on where it is read."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return cv2.getNumThreads()


@pytest.mark.parametrize("plain", [False, True], ids=["dataset-loader", "plain-dataloader"])
@pytest.mark.parametrize("persistent_workers", [False, True])
def test_forked_workers_run_opencv_on_one_thread(persistent_workers: bool, plain: bool) -> None:
    # Each worker is one of the parallel tasks: OpenCV's own pool in every worker would
    # compete with the other workers for the cores. This process keeps its setting.
    before = cv2.getNumThreads()
    cv2.setNumThreads(2)
    try:
        loader = (DataLoader if plain else ResumableDataLoader)(
            OpenCVThreads(),
            batch_size=2,
            num_workers=2,
            multiprocessing_context=_FORK,
            persistent_workers=persistent_workers,
        )
        for _ in range(2):
            assert [int(n) for batch in loader for n in batch] == [1, 1, 1, 1]
            assert cv2.getNumThreads() == 2
    finally:
        cv2.setNumThreads(before)
