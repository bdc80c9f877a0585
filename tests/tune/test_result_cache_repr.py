"""A cached autotune result says it is cached; a TuneResult's repr is one short line; cache
keys tell transforms with different parameters apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.cli import main
from fastdata.transforms import CenterCrop, Compose, Resize
from fastdata.tune import autotune
from fastdata.tune._cache import describe
from tests.tune.synthetic import SleepDataset, write_tiny_shards

FAST = {"max_workers": 0, "window_s": 0.05, "progress": False}


def test_a_cached_result_says_so_and_when_it_was_measured(tmp_path: Path) -> None:
    dataset = SleepDataset(64, cost_s=0.0)
    fresh = autotune(dataset, 4, cache=tmp_path, **FAST)
    cached = autotune(dataset, 4, cache=tmp_path, **FAST)
    assert not fresh.from_cache and "cache" not in fresh.explanation
    assert cached.from_cache
    assert cached.explanation.startswith("Loaded from the autotune cache (measured 20")
    assert "nothing was measured now" in cached.explanation
    assert "recommended (from cache):" in str(cached)


def test_the_command_says_a_result_is_cached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shards = write_tiny_shards(tmp_path)
    argv = ["tune", str(shards), "--batch-size", "8", "--time-budget", "1", "--max-workers", "0"]
    assert main([*argv, "-q", "--cache"]) == 0
    assert "autotune cache" not in capsys.readouterr().out
    assert main([*argv, "-q", "--cache"]) == 0
    assert "why           Loaded from the autotune cache" in capsys.readouterr().out


def test_repr_is_one_short_line_and_print_keeps_the_table() -> None:
    result = autotune(SleepDataset(64, cost_s=0.0), 4, **FAST)
    text = repr(result)
    assert "\n" not in text and len(text) < 200
    assert text.startswith("TuneResult(recommended='in-process'")
    assert "batch_size=4" in text and "limited_by=" in text
    assert str(result).splitlines()[0].split()[:2] == ["configuration", "batches/s"]


def test_transform_parameters_are_part_of_the_cache_key() -> None:
    assert describe(Resize(64)) != describe(Resize(128))
    assert describe(Compose([Resize(64), CenterCrop(64)])) != describe(
        Compose([Resize(64), CenterCrop(56)])
    )
    assert describe(object()) == "builtins.object"  # no address in a key
