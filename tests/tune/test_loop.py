"""The timed loop shared by autotune and profile."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from fastdata import profile
from fastdata.tune._loop import timed_steps


class Counted:
    """An iterable of ``n`` batches that counts the batches handed out and the epochs."""

    def __init__(self, n: int) -> None:
        self.n, self.fetched, self.epochs = n, 0, 0

    def __iter__(self) -> Iterator[int]:
        self.epochs += 1
        for i in range(self.n):
            self.fetched += 1
            yield i


def test_one_epoch_without_repeat() -> None:
    seen: list[int] = []
    firsts: list[int] = []
    ticks = list(timed_steps(Counted(4), seen.append, first=firsts.append))
    assert len(ticks) == 4 and seen == [0, 1, 2, 3] and firsts == [0]
    assert all(t.wait_s >= 0 and t.step_s >= 0 and t.done >= t.fetched for t in ticks)
    assert ticks[0].since_start_s <= ticks[-1].since_start_s


def test_repeat_starts_new_epochs_and_stops_when_closed() -> None:
    data = Counted(3)
    ticks = timed_steps(data, None, repeat=True)
    assert len(list(itertools.islice(ticks, 7))) == 7
    ticks.close()
    assert data.epochs == 3 and data.fetched == 7


def test_repeat_over_an_empty_loader_yields_nothing() -> None:
    assert list(timed_steps(Counted(0), None, repeat=True)) == []


def test_synchronize_runs_after_every_step() -> None:
    order: list[str] = []
    list(
        timed_steps(
            Counted(2), lambda _b: order.append("step"), synchronize=lambda: order.append("sync")
        )
    )
    assert order == ["step", "sync", "step", "sync"]


class _Fetches(Dataset[Any]):
    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> torch.Tensor:
        self.reads += 1
        return torch.zeros(1)


def test_profile_reads_no_batch_past_warmup_plus_steps() -> None:
    dataset = _Fetches()
    loader = DataLoader(dataset, batch_size=1)
    report = profile(loader, lambda _b: None, steps=5, warmup=2, probe_batches=1, progress=False)
    assert report.steps == 5
    assert dataset.reads == 2 + 5 + 1  # the loop, then one replayed probe batch
