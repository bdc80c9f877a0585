"""benchmarks/bench_preprocess.py counts the CPU time of the whole process tree, and its
bound and fastdata runs report what they processed."""

from __future__ import annotations

import importlib
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BURN_S = 0.3


def _burn_cpu() -> None:
    started = time.process_time()
    while time.process_time() - started < _BURN_S:
        pass


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("psutil")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("bench_preprocess")


@pytest.mark.parametrize("joined", [True, False], ids=["ended", "running"])
def test_tree_cpu_counts_child_processes_alive_or_ended(bench: Any, joined: bool) -> None:
    context = multiprocessing.get_context("fork")
    before = bench.tree_cpu_s()
    child = context.Process(target=_burn_cpu)
    child.start()
    if joined:
        child.join()
    else:  # still running (a kept worker): read while alive, after its work
        while child.is_alive() and bench.tree_cpu_s() - before < _BURN_S:
            time.sleep(0.01)
    spent = bench.tree_cpu_s() - before
    child.join()
    assert spent >= _BURN_S * 0.95  # clock granularity
    after = bench.tree_cpu_s()
    assert after - before >= spent  # counted once, never dropped when it ends


def test_fastdata_run_and_bound_count_every_image(
    bench: Any, sample_imagefolder: Path, tmp_path: Path
) -> None:
    options = bench.JOBS["raw_224"][0]
    timed = bench.run_fastdata(sample_imagefolder, tmp_path / "out", options, 2)
    assert timed.images == 24 and timed.wall_s > 0 and timed.cpu_s > 0
    assert not (tmp_path / "out").exists()
    listing = bench.list_source(sample_imagefolder)
    job = bench.ShardJob(
        str(tmp_path), options, bench.build_fields(listing, options), "imagefolder"
    )
    work, store = bench.measure_bound(listing.items, job, 2)
    assert work.images == store.images == (24 - bench._WARMUP_ITEMS) * 2
    assert store.cpu_s > work.cpu_s > 0 and store.per_s < work.per_s
