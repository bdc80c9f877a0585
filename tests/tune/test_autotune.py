"""autotune against synthetic datasets and consumers whose optimum is known."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastdata._system import usable_cpus
from fastdata.datasets import ShardDataset, passthrough_collate
from fastdata.errors import InsufficientMemoryError
from fastdata.tune import TuneResult, autotune, autotuner
from fastdata.tune._cache import dataset_fingerprint
from fastdata.tune._measure import LoaderConfig
from tests.tune.synthetic import (
    BusyDataset,
    ModelledWindows,
    SleepDataset,
    ThreadedSleepDataset,
    passthrough,
    sleep_step,
    write_tiny_shards,
)


def test_lands_within_10_percent_of_an_exhaustive_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    # 30 ms of reading per batch and worker, a 12 ms step: in-process ~24 batches/s, then
    # 33, 67 and (capped by the step) 83 for one to four workers.
    def rate(config: LoaderConfig) -> float:
        if config.num_workers == 0:
            return 1 / (0.030 + 0.012)
        return min(1 / 0.012, config.num_workers / 0.030)

    ModelledWindows(rate, step_s=0.012).install(monkeypatch)
    result = autotune(SleepDataset(10_000, 0.0), 2, step=sleep_step(0.0), max_workers=4,
                      progress=False)  # fmt: skip
    sweep = {workers: rate(LoaderConfig(workers, 2 if workers else None)) for workers in range(5)}
    assert sweep[result.num_workers] >= 0.9 * max(sweep.values())
    assert result.num_workers == 3  # the fewest workers that feed the step
    assert result.limited_by == "consumer"


def test_respects_the_ram_budget_and_says_memory_is_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 MiB batches, 30 MiB per worker: at prefetch 2, two workers hold 140 MiB, three
    # 202; throughput grows with every worker, so only memory stops the search.
    ModelledWindows(
        lambda config: 12.5 * max(1, config.num_workers),
        batch_bytes=16 << 20,
        worker_bytes=30 << 20,
    ).install(monkeypatch)
    budget = 140 << 20
    dataset = SleepDataset(1_000, cost_s=0.0)
    result = autotune(dataset, 4, ram_budget=budget, max_workers=4, progress=False)
    assert result.budget_bytes == budget
    assert result.batch_bytes == 16 << 20
    assert all(m.predicted_bytes <= budget for m in result.measurements)
    assert result.num_workers == 2
    assert result.limited_by == "memory"
    assert "Memory, not CPU, is the limit" in result.explanation


def test_two_batches_over_the_budget_raise() -> None:
    with pytest.raises(InsufficientMemoryError, match="over the memory budget"):
        autotune(SleepDataset(100, 0.0), 4, ram_budget=100, window_s=0.05, progress=False)


def test_handles_a_single_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 ms of CPU per batch and a 15 ms step: one worker overlaps the two.
    monkeypatch.setattr(autotuner, "usable_cpus", lambda: 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ModelledWindows(
        lambda config: 1 / 0.015 if config.num_workers else 1 / (0.008 + 0.015), step_s=0.015
    ).install(monkeypatch)
    result = autotune(BusyDataset(10_000, 0.0), 4, step=sleep_step(0.0), progress=False)
    assert result.max_workers == 1
    assert max(m.config.num_workers for m in result.measurements) == 1
    assert result.num_workers == 1
    assert result.loader_kwargs["persistent_workers"] is True


def test_prefers_in_process_threads_when_they_are_as_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 samples x 1 ms per batch: n threads read one in 8/n ms, while each worker also pays
    # 40 ms a batch for the transfer (4 workers: ~83 batches/s).
    def rate(config: LoaderConfig) -> float:
        if config.num_workers == 0:
            return (config.num_threads or 1) / 0.008
        return config.num_workers / 0.048

    ModelledWindows(rate).install(monkeypatch)
    dataset = ThreadedSleepDataset(10_000, cost_s=0.001, sample_bytes=1 << 10, worker_cost_s=0.04)
    result = autotune(dataset, 8, max_workers=4, collate_fn=passthrough, progress=False)
    assert result.num_workers == 0
    assert result.num_threads == 4
    assert result.dataset_kwargs == {"num_threads": result.num_threads}
    assert "prefetch_factor" not in result.loader_kwargs
    assert any(m.config.num_workers > 0 for m in result.measurements)
    # workers at a sixth of the threads' rate: a deeper queue is not tried
    assert all(m.config.prefetch_factor in (None, 2) for m in result.measurements)
    assert dataset.num_threads == 1  # restored
    loader = result.make_loader(dataset)
    assert dataset.num_threads == result.num_threads
    assert next(iter(loader)).shape == (8, 1 << 10)


def test_measures_real_workers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # real loaders and clocks: only what holds however loaded the machine is
    budget = 1 << 30
    result = autotune(
        SleepDataset(400, 0.002),
        4,
        max_workers=2,
        ram_budget=budget,
        window_s=0.1,
        time_budget_s=600,  # no deadline cuts the search short on a busy machine
        progress=False,
    )
    assert result.recommended in {m.config for m in result.measurements}
    assert {m.config.num_workers for m in result.measurements} >= {0, 1}
    assert result.worker_bytes is not None and result.worker_bytes > 0  # measured USS
    assert all(m.batches_per_s > 0 and m.num_batches > 0 for m in result.measurements)
    assert len(list(result.make_loader(SleepDataset(12, 0.0)))) == 3


def test_keeps_the_callers_loader_arguments() -> None:
    calls: list[int] = []

    def collate(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        calls.append(len(samples))
        return {"x": torch.stack(samples)}

    dataset = SleepDataset(30, cost_s=0.0)
    result = autotune(
        dataset, 4, collate_fn=collate, drop_last=True, max_workers=0, window_s=0.05, progress=False
    )
    assert calls  # used while measuring
    assert result.loader_kwargs == {
        "batch_size": 4,
        "collate_fn": collate,
        "drop_last": True,
        "num_workers": 0,
        "pin_memory": result.pin_memory,
    }
    batches = list(result.make_loader(dataset))
    assert len(batches) == 7 and batches[0]["x"].shape == (4, 16)


def test_caches_by_dataset_batch_size_and_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dataset = SleepDataset(100, cost_s=0.0)
    first = autotune(dataset, 4, max_workers=1, window_s=0.05, cache=tmp_path, progress=False)
    again = autotune(dataset, 4, max_workers=1, window_s=0.05, cache=tmp_path, progress=False)
    other = autotune(dataset, 8, max_workers=1, window_s=0.05, cache=tmp_path, progress=False)
    assert not first.from_cache and again.from_cache and not other.from_cache
    assert again.recommended == first.recommended
    assert again.measurements == first.measurements
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_default_max_workers_divides_cpus_among_local_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(autotuner, "usable_cpus", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert autotuner.default_max_workers() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "zero")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be a positive integer, got 'zero'"):
        autotuner.default_max_workers()


def test_ram_budget_is_a_fraction_or_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autotuner, "available_memory_bytes", lambda: 1000)
    assert autotuner.budget_bytes(0.5) == 500
    assert autotuner.budget_bytes(4096) == 4096


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be a positive integer, got 0"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int, got float"),
        ({"max_workers": True}, TypeError, "max_workers must be an int, got bool"),
        ({"num_workers": 2}, ValueError, "loader_kwargs must not set num_workers"),
        ({"ram_budget": 0}, ValueError, "ram_budget must be a fraction .* got 0"),
        ({"ram_budget": "half"}, TypeError, "ram_budget must be a number, got str"),
        ({"time_budget_s": 0}, ValueError, "time_budget_s must be positive, got 0"),
        ({"max_workers": -1}, ValueError, "max_workers must be a non-negative integer, got -1"),
        ({"min_gain": 1.0}, ValueError, r"min_gain must be in \[0, 1\), got 1.0"),
        ({"window_s": 0}, ValueError, "window_s must be positive, got 0"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    arguments = {"batch_size": 4, **kwargs}
    with pytest.raises(error, match=match):
        autotune(SleepDataset(10, 0.0), progress=False, **arguments)


def test_an_empty_dataset_is_an_error() -> None:
    with pytest.raises(ValueError, match="the loader yields no batch"):
        autotune(SleepDataset(0, 0.0), 4, window_s=0.05, progress=False)


def test_result_round_trips_through_a_dict() -> None:
    result = autotune(SleepDataset(50, 0.0), 4, max_workers=1, window_s=0.05, progress=False)
    again = TuneResult.from_dict(result.to_dict())
    assert again.to_dict() == result.to_dict()


def test_restores_a_shard_datasets_automatic_thread_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dataset = ShardDataset(write_tiny_shards(tmp_path))
    automatic = dataset.num_threads  # unset: usable CPUs in the main process, 1 in workers
    result = autotune(
        dataset, 8, max_workers=2, window_s=0.05, collate_fn=passthrough_collate, progress=False
    )
    assert {m.config.num_threads for m in result.measurements} >= {1}
    assert dataset.num_threads == automatic == usable_cpus()
    images, labels = next(iter(result.make_loader(dataset)))
    assert images.shape == (8, 3, 16, 16) and labels.shape == (8,)


def test_shard_sets_of_equal_length_do_not_share_a_cache_entry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = ShardDataset(write_tiny_shards(tmp_path / "a", num_samples=32))
    second = ShardDataset(write_tiny_shards(tmp_path / "b", num_samples=32, seed=1))
    assert dataset_fingerprint(first) != dataset_fingerprint(second)
    assert dataset_fingerprint(first) == dataset_fingerprint(ShardDataset(tmp_path / "a"))


def test_a_dataset_that_decodes_batches_here_is_tuned_through_its_own_loader(
    tmp_path: Path,
) -> None:
    # A decoder that runs on whole batches in the training process (nvjpeg, dali): a
    # plain DataLoader with workers over the dataset is refused at its first batch, so
    # the workers' trials and the tuned loader are the dataset's own loader.
    from fastdata.datasets import RAMDataset, ResumableDataLoader  # noqa: PLC0415
    from fastdata.decode.cpu import CpuDecoder  # noqa: PLC0415
    from tests.datasets.conftest import write_jpegs  # noqa: PLC0415

    class BatchedCpuDecoder(CpuDecoder):
        backend = "batched-cpu"

    paths = write_jpegs(tmp_path, 16, 48, 64)
    decoder = BatchedCpuDecoder(16, num_threads=1)
    dataset = RAMDataset(paths, list(range(16)), decode=decoder, show_progress=False)
    result = autotune(dataset, 4, max_workers=1, window_s=0.2, progress=False)
    assert {m.config.num_workers for m in result.measurements} >= {0, 1}
    loader = result.make_loader(dataset)
    assert isinstance(loader, ResumableDataLoader)
    assert next(iter(loader))[0].shape == (4, 3, 16, 16)
