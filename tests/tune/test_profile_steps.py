"""profile on a loader shorter than ``warmup + steps`` warns instead of silently timing
fewer steps."""

from __future__ import annotations

import warnings

import pytest
from torch.utils.data import DataLoader

from fastdata.tune import profile
from tests.tune.synthetic import SleepDataset, sleep_step


def test_a_short_loader_warns_with_the_steps_timed() -> None:
    loader = DataLoader(SleepDataset(96, cost_s=0.0), batch_size=4)  # 24 batches
    with pytest.warns(UserWarning, match=r"ended after 24 batches, so 21 steps were timed, not"):
        report = profile(loader, sleep_step(0.0), steps=50, progress=False)
    assert report.steps == 21


def test_a_long_enough_loader_does_not_warn() -> None:
    loader = DataLoader(SleepDataset(96, cost_s=0.0), batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = profile(loader, sleep_step(0.0), steps=21, progress=False)
    assert report.steps == 21
