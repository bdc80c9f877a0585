"""profile: input-bound (I/O, CPU) and compute-bound loops of known cost."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.tune import ProfileReport, profile
from fastdata.tune.profiler import INPUT_BOUND_SHARE
from tests.tune.synthetic import BusyDataset, SleepDataset, SleepStream, sleep_step


def test_calls_a_loop_waiting_on_slow_reads_input_bound_io() -> None:
    loader = DataLoader(SleepDataset(200, cost_s=0.004), batch_size=4)  # 16 ms per batch
    report = profile(loader, sleep_step(0.001), steps=10, progress=False)
    assert report.verdict == "input-bound (I/O)"
    assert report.wait_fraction > 0.5
    assert report.stages is not None and report.stages.fetch_s > 0.012
    assert report.stages.cpu_share < 0.5
    assert "storage" in report.advice


def test_calls_a_loop_waiting_on_cpu_bound_reads_input_bound_cpu() -> None:
    loader = DataLoader(BusyDataset(200, cost_s=0.003), batch_size=4)  # 12 ms CPU per batch
    report = profile(loader, sleep_step(0.001), steps=8, progress=False)
    assert report.verdict == "input-bound (CPU)"
    assert report.stages is not None and report.stages.cpu_share >= 0.5
    assert "num_workers" in report.advice or "offline" in report.advice


def test_calls_a_loop_with_a_slow_step_compute_bound() -> None:
    loader = DataLoader(SleepDataset(200, cost_s=0.0), batch_size=4)
    report = profile(loader, sleep_step(0.05), steps=8, device="cpu", progress=False)
    assert report.verdict == "compute-bound"
    assert report.bound == "compute" and report.input_kind is None
    assert report.wait_fraction < INPUT_BOUND_SHARE
    assert report.stages is not None and report.stages.to_device_s is not None
    assert "step itself" in report.advice


def test_workers_that_keep_up_make_the_loop_compute_bound() -> None:
    # 8 ms per batch to read, 2 workers: they supply a batch every ~4 ms; the step takes 30.
    # 25 steps: only ~190 ms of waiting in all would make the loop input-bound (20% of it),
    # more than a busy machine's hiccups (12 steps of 20 ms once flipped on ~60 ms in CI).
    loader = DataLoader(SleepDataset(400, 0.002), batch_size=4, num_workers=2)
    report = profile(loader, sleep_step(0.030), steps=25, warmup=4, progress=False)
    assert report.verdict == "compute-bound"
    assert report.num_workers == 2


def test_iterable_datasets_get_a_verdict_without_stages() -> None:
    loader = DataLoader(SleepStream(100, 0.005), batch_size=2)
    report = profile(loader, sleep_step(0.0), steps=5, progress=False)
    assert report.stages is None
    assert report.verdict == "input-bound"
    assert "iterable" in report.advice


def test_report_renders_as_text_and_html() -> None:
    loader = DataLoader(SleepDataset(40, 0.0), batch_size=4)
    report = profile(loader, sleep_step(0.0), steps=3, progress=False)
    assert isinstance(report, ProfileReport)
    assert str(report).startswith(f"verdict: {report.verdict}")
    assert "next:" in str(report)
    assert "<b>fastdata.profile</b>" in report._repr_html_()


@pytest.mark.parametrize(
    ("loader", "step", "kwargs", "error", "match"),
    [
        (
            [torch.zeros(1)],
            print,
            {},
            TypeError,
            "loader must be a torch.utils.data.DataLoader, got list",
        ),
        (None, 3, {}, TypeError, "step must be callable, got int"),
        (None, print, {"steps": 0}, ValueError, "steps must be an integer >= 1, got 0"),
        (None, print, {"warmup": -1}, ValueError, "warmup must be an integer >= 0, got -1"),
        (
            None,
            print,
            {"probe_batches": 0},
            ValueError,
            "probe_batches must be an integer >= 1, got 0",
        ),
        (None, print, {"warmup": 10}, ValueError, "the loader ended before a step could be timed"),
    ],
)
def test_rejects_bad_arguments(loader, step, kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    if loader is None:
        loader = DataLoader(SleepDataset(8, 0.0), batch_size=4)
    with pytest.raises(error, match=match):
        profile(loader, step, progress=False, **kwargs)
