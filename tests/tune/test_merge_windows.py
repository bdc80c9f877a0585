"""Two timed windows of one configuration merged into one measurement."""

from __future__ import annotations

import pytest

from fastdata.tune._measure import LoaderConfig, Measurement
from fastdata.tune._search import merge_windows


def _window(rate: float, batches: int, worker_bytes: int | None) -> Measurement:
    return Measurement(
        config=LoaderConfig(2, 2),
        batches_per_s=rate,
        spread=0.1,
        wait_s=1 / rate,
        step_s=0.0,
        startup_s=rate,
        predicted_bytes=batches,
        worker_bytes=worker_bytes,
        num_batches=batches,
    )


def test_merge_windows_weighs_by_time_and_keeps_the_larger_memory() -> None:
    merged = merge_windows(_window(10.0, 10, None), _window(20.0, 20, 5))
    assert merged.batches_per_s == pytest.approx(30 / (1.0 + 1.0))
    assert merged.num_batches == 30
    assert merged.wait_s == pytest.approx((0.1 * 10 + 0.05 * 20) / 30)
    assert merged.startup_s == 10.0
    assert merged.predicted_bytes == 20
    assert merged.worker_bytes == 5
    assert merged.config == LoaderConfig(2, 2)
