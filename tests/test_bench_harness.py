"""The benchmarks' result rule: a run writes its own file under benchmarks/results/runs/
(git-ignored); the tracked benchmarks/results/<topic>.json (and the loaders chart) change only
with ``--publish`` on a whole run."""

from __future__ import annotations

import ast
import importlib
import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module("_harness")
    monkeypatch.setattr(module, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(module, "RUNS_DIR", tmp_path / "results" / "runs")
    (tmp_path / "results").mkdir()
    return module


def test_only_a_published_whole_run_replaces_the_tracked_file(
    harness: ModuleType, tmp_path: Path
) -> None:
    tracked = tmp_path / "results" / "demo.json"
    first = harness.save("demo", {"x": 1})
    assert first.published is None and not tracked.exists()
    assert first.run.parent == tmp_path / "results" / "runs" and first.run.is_file()
    assert harness.save("demo", {"x": 2}, partial=True, publish=True).published is None
    assert not tracked.exists()
    published = harness.save("demo", {"x": 3}, publish=True)
    assert published.published == tracked and '"x": 3' in tracked.read_text()


def test_the_runs_folder_is_git_ignored() -> None:
    done = subprocess.run(
        ["git", "check-ignore", "-q", "benchmarks/results/runs/loaders-20260101T000000Z.json"],
        cwd=ROOT,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_every_benchmark_follows_the_rule(script: Path) -> None:
    """Each script takes --publish, passes it to save(), and writes no results itself."""
    tree = ast.parse(script.read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    names = [getattr(call.func, "id", getattr(call.func, "attr", "")) for call in calls]
    assert "add_publish_argument" in names
    saves = [call for call in calls if getattr(call.func, "id", "") == "save"]
    assert saves, "no save() call"
    for call in saves:
        publish = [kw for kw in call.keywords if kw.arg == "publish"]
        assert len(publish) == 1 and ast.unparse(publish[0].value) == "args.publish"
    assert "RESULTS_DIR" not in script.read_text()


def test_a_partial_loaders_run_leaves_the_tracked_files(
    harness: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPLBACKEND", "Agg")
    pytest.importorskip("matplotlib")
    bench = importlib.import_module("bench_loaders")
    chart = tmp_path / "bench_loaders.png"
    monkeypatch.setattr(bench, "CHART", chart)
    argv = ["--data", str(tmp_path / "data"), "--num-images", "16", "--batch-size", "8",
            "--min-seconds", "0.01", "--repeats", "1", "--only", "naive PIL, uint8"]  # fmt: skip
    assert bench.main([*argv, "--publish"]) == 0
    assert not (tmp_path / "results" / "loaders.json").exists() and not chart.exists()
    runs = sorted((tmp_path / "results" / "runs").iterdir())
    assert [p.suffix for p in runs] == [".json", ".png"]


def test_a_pass_goes_on_past_its_batches_until_its_minimum_time(harness: ModuleType) -> None:
    # CPU time is read in 10 ms ticks: a fast loader's pass is made long enough to read it
    class Epochs:
        def __iter__(self) -> Iterator[tuple[list[int]]]:
            for _ in range(4):  # an epoch: 4 batches of 2 images, 20 ms each
                time.sleep(0.02)
                yield ([0, 0],)

    def images(min_seconds: float) -> float:
        ticks = itertools.count()  # reads 0 at the start, 1 at the end: images per pass
        return harness.images_per(Epochs(), 3, 1, [lambda: float(next(ticks))], min_seconds)[0]

    assert images(0.0) == 3 * 2
    assert images(0.2) >= 8 * 2  # 0.2 s of 20 ms batches, across epochs
