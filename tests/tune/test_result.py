"""TuneResult rendering: table, HTML, plot, settings; built from known measurements."""

from __future__ import annotations

import sys

import pytest

from fastdata.tune import LoaderConfig, Measurement, TuneResult


def _measurement(config: LoaderConfig, rate: float, memory: int) -> Measurement:
    return Measurement(
        config=config,
        batches_per_s=rate,
        spread=rate / 20,
        wait_s=1 / rate / 2,
        step_s=1 / rate / 2,
        startup_s=0.1,
        predicted_bytes=memory,
        worker_bytes=memory // 4 if config.num_workers else None,
        num_batches=50,
    )


@pytest.fixture
def result() -> TuneResult:
    base = LoaderConfig(0, None, 1)
    picked = LoaderConfig(2, 2, 1)
    return TuneResult(
        recommended=picked,
        measurements=[
            _measurement(base, 10.0, 2 << 20),
            _measurement(LoaderConfig(0, None, 2), 18.0, 2 << 20),
            _measurement(picked, 30.0, 40 << 20),
            _measurement(LoaderConfig(2, 4), 30.5, 60 << 20),
        ],
        batch_size=32,
        batch_bytes=1 << 20,
        worker_bytes=10 << 20,
        budget_bytes=1 << 30,
        max_workers=2,
        limited_by="cpus",
        explanation="Because <measured>.",
        wall_time_s=3.0,
        extra_kwargs={"drop_last": True},
    )


def test_settings_and_loader_kwargs(result: TuneResult) -> None:
    assert result.best.batches_per_s == 30.0
    assert result.recommended_settings() == {
        "num_workers": 2,
        "pin_memory": False,
        "prefetch_factor": 2,
        "persistent_workers": True,
        "num_threads": 1,
    }
    assert result.loader_kwargs["drop_last"] is True
    assert result.loader_kwargs["batch_size"] == 32


def test_table_marks_the_recommendation(result: TuneResult) -> None:
    lines = result.table().splitlines()
    assert lines[0].split() == ["configuration", "batches/s", "samples/s", "wait", "ms", "memory"]
    marked = [line for line in lines if line.startswith("*")]
    assert len(marked) == 1 and "2 workers, prefetch 2" in marked[0]
    assert "30.0 ± 1.5" in marked[0] and "960" in marked[0] and "40.0 MiB" in marked[0]
    assert str(result).endswith("Because <measured>.")


def test_html_escapes_and_highlights(result: TuneResult) -> None:
    page = result._repr_html_()
    assert page.count("<tr style=") == 1
    assert "Because &lt;measured&gt;." in page
    assert "<code>num_workers=2</code>" in page


def test_plot_draws_one_series_per_kind(result: TuneResult) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    ax = result.plot()
    labels = sorted(text.get_text() for text in ax.get_legend().get_texts())
    assert labels == [
        "in-process threads",
        "recommended",
        "workers, prefetch 2",
        "workers, prefetch 4",
    ]


def test_plot_without_matplotlib_says_how_to_install(
    result: TuneResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'torch-fastdata\[plot\]'"):
        result.plot()
