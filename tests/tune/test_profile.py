"""profile: input-bound (I/O, CPU, CPU contention) and compute-bound loops of known cost.

The verdicts are measured on a :class:`~tests.tune.synthetic.VirtualClock`, so that they
hold on a loaded machine; what the real clocks measure is checked by bounds that hold
however loaded the machine is (a sleep is at least as long as asked, a CPU burn at least as
much CPU)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch
from torch.utils.data import DataLoader

from fastdata._system import usable_cpus
from fastdata.tune import ProfileReport, profile
from fastdata.tune._stages import StageTimes, time_stages
from fastdata.tune.profiler import INPUT_BOUND_SHARE
from tests.tune.synthetic import (
    BusyDataset,
    SleepDataset,
    VirtualClock,
    VirtualDataset,
    VirtualStream,
    sleep_step,
    virtual_step,
)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    virtual = VirtualClock()
    virtual.install(monkeypatch)
    return virtual


def test_calls_a_loop_waiting_on_slow_reads_input_bound_io(clock: VirtualClock) -> None:
    loader = DataLoader(VirtualDataset(200, clock, blocked_s=0.004), batch_size=4)
    report = profile(loader, virtual_step(clock, 0.001), steps=10, progress=False)
    assert report.verdict == "input-bound (I/O)"
    assert report.wait_fraction == pytest.approx(16 / 17)
    assert report.stages is not None and report.stages.fetch_s == pytest.approx(0.016)
    assert report.stages.io_share == pytest.approx(1.0)
    assert "storage" in report.advice


def test_calls_a_loop_waiting_on_cpu_bound_reads_input_bound_cpu(clock: VirtualClock) -> None:
    loader = DataLoader(VirtualDataset(200, clock, cpu_s=0.003), batch_size=4)
    report = profile(loader, virtual_step(clock, 0.001), steps=8, progress=False)
    assert report.verdict == "input-bound (CPU)"
    assert report.stages is not None and report.stages.cpu_share == pytest.approx(1.0)
    assert "num_workers" in report.advice or "offline" in report.advice


def test_reads_waiting_for_a_busy_machine_are_cpu_contention_not_their_own_work(
    clock: VirtualClock,
) -> None:
    # each sample: 1 ms of its own CPU work, 3 ms waiting for a CPU other processes hold
    loader = DataLoader(VirtualDataset(200, clock, cpu_s=0.001, run_wait_s=0.003), batch_size=4)
    report = profile(loader, virtual_step(clock, 0.001), steps=8, progress=False)
    assert report.verdict == "input-bound (CPU contention)"
    assert report.input_kind == "contention"
    assert report.stages is not None
    shares = (report.stages.cpu_share, report.stages.contention_share, report.stages.io_share)
    assert shares == pytest.approx((0.25, 0.75, 0.0))
    assert "machine is busy" in report.advice and "75%" in report.advice
    assert "75% waiting for one (other processes)" in str(report)
    # a sleeping read on the same busy machine is still I/O: its waits are counted apart
    sleeping = DataLoader(VirtualDataset(200, clock, blocked_s=0.004, run_wait_s=0.001))
    assert profile(sleeping, virtual_step(clock, 0.0), steps=4, progress=False).input_kind == "io"


@pytest.mark.parametrize(
    ("cost", "kind"),
    [
        ((0.6, 0.3, 0.1), "cpu"),  # the largest share decides
        ((0.2, 0.5, 0.3), "contention"),
        ((0.3, 0.3, 0.4), "io"),
        ((1.5, 0.5, 0.0), "cpu"),  # threads overlapping: shares of their summed time
    ],
)
def test_the_largest_share_names_the_kind(cost: tuple[float, float, float], kind: str) -> None:
    cpu_s, run_wait_s, blocked_s = cost
    wall_s = cpu_s + run_wait_s + blocked_s if cpu_s <= 1 else 1.0
    stages = StageTimes(wall_s, 0.0, None, cpu_s=cpu_s, run_wait_s=run_wait_s)
    assert stages.input_kind == kind
    assert stages.cpu_share + stages.contention_share + stages.io_share == pytest.approx(1.0)


def test_calls_a_loop_with_a_slow_step_compute_bound(clock: VirtualClock) -> None:
    loader = DataLoader(VirtualDataset(200, clock), batch_size=4)
    report = profile(loader, virtual_step(clock, 0.05), steps=8, device="cpu", progress=False)
    assert report.verdict == "compute-bound"
    assert report.bound == "compute" and report.input_kind is None
    assert report.wait_fraction < INPUT_BOUND_SHARE
    assert report.stages is not None and report.stages.to_device_s is not None
    assert "step itself" in report.advice


def test_iterable_datasets_get_a_verdict_without_stages(clock: VirtualClock) -> None:
    loader = DataLoader(VirtualStream(100, clock, blocked_s=0.005), batch_size=2)
    report = profile(loader, virtual_step(clock, 0.0), steps=5, progress=False)
    assert report.stages is None
    assert report.verdict == "input-bound"
    assert "iterable" in report.advice


def test_a_loop_with_workers_is_timed_and_replayed() -> None:
    # real workers and clocks: only what holds however loaded the machine is
    loader = DataLoader(SleepDataset(400, 0.002), batch_size=4, num_workers=2)
    report = profile(loader, sleep_step(0.010), steps=6, warmup=2, progress=False)
    assert report.num_workers == 2 and report.steps == 6
    assert report.step_s >= 6 * 0.010
    assert report.stages is not None and report.stages.fetch_s >= 4 * 0.002
    assert report.verdict in {
        "compute-bound",
        "input-bound (I/O)",
        "input-bound (CPU)",
        "input-bound (CPU contention)",
    }


def test_real_sleeps_are_counted_off_the_cpu_and_real_work_on_it() -> None:
    sleeping = time_stages(DataLoader(SleepDataset(40, 0.004), batch_size=4), 3, None)
    assert sleeping is not None
    off_cpu_s = sleeping.fetch_s + sleeping.collate_s - sleeping.cpu_s - sleeping.run_wait_s
    # A sleep lasts at least as asked, never on a CPU. The three readings (wall clock, thread
    # CPU time, schedstat) are taken at slightly different moments, a millisecond or so apart
    # on a busy machine: half the sleeps is a bound no load breaks, and no CPU work reaches.
    assert off_cpu_s >= 4 * 0.004 / 2
    busy = time_stages(DataLoader(BusyDataset(40, 0.003), batch_size=4), 3, None)
    assert busy is not None and busy.cpu_s >= 4 * 0.003  # CPU burnt is CPU time


def _spin() -> None:
    while True:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
def test_waiting_for_a_cpu_held_by_other_processes_is_measured() -> None:
    context = multiprocessing.get_context("fork")
    spinners = [context.Process(target=_spin, daemon=True) for _ in range(usable_cpus() + 1)]
    for spinner in spinners:
        spinner.start()
    try:
        # more runnable threads than CPUs: burning CPU time means waiting for it too
        busy = time_stages(DataLoader(BusyDataset(8, 0.05), batch_size=4), 2, None)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()
    assert busy is not None and busy.cpu_s >= 4 * 0.05 and busy.run_wait_s > 0


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
