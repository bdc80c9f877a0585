"""Pixel statistics: per-sample sums merged per shard and over shards equal one pass."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastdata.preprocess._stats import PixelStats, StatsTotals, merge_fields


def _images(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, (int(rng.integers(5, 40)), int(rng.integers(5, 40)), 3), np.uint8)
        for _ in range(count)
    ]


def test_merged_per_sample_stats_equal_one_pass_over_all_pixels() -> None:
    images = _images(17)
    merged = PixelStats.of_image(images[0])
    for image in images[1:]:
        merged = merged.merge(PixelStats.of_image(image))
    pixels = np.concatenate([image.reshape(-1, 3) for image in images]).astype(np.float64)
    assert (merged.samples, merged.pixels) == (17, float(len(pixels)))
    np.testing.assert_allclose(merged.sums, pixels.sum(0), rtol=1e-12)
    np.testing.assert_allclose(merged.squares, (pixels * pixels).sum(0), rtol=1e-12)
    np.testing.assert_allclose(merged.mean, pixels.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.std, pixels.std(0), rtol=1e-9)


def test_merging_per_shard_then_over_shards_equals_merging_every_sample() -> None:
    per_sample = [{"image": PixelStats.of_image(image)} for image in _images(12, seed=1)]
    one_shard: dict[str, PixelStats] = {}
    for stats in per_sample:
        one_shard = merge_fields(one_shard, stats)
    shards = []
    for start in (0, 5, 9):  # three shards of 5, 4 and 3 samples
        shard: dict[str, PixelStats] = {}
        for stats in per_sample[start : {0: 5, 5: 9, 9: 12}[start]]:
            shard = merge_fields(shard, stats)
        shards.append(shard)
    over_shards: dict[str, PixelStats] = {}
    for shard in shards:
        over_shards = merge_fields(over_shards, shard)
    merged, whole = over_shards["image"], one_shard["image"]
    assert (merged.samples, merged.pixels) == (whole.samples, whole.pixels)
    np.testing.assert_allclose(merged.sums, whole.sums, rtol=1e-12)
    np.testing.assert_allclose(merged.std, whole.std, rtol=1e-12)


def test_array_stats_are_one_channel_over_every_element() -> None:
    volume = np.arange(24, dtype=np.uint16).reshape(2, 3, 4)
    stats = PixelStats.of_array(volume)
    assert (stats.samples, stats.pixels, stats.sums) == (1, 24.0, (276.0,))
    assert stats.mean == [11.5] and math.isclose(stats.std[0], float(np.std(np.arange(24))))


def test_json_round_trip_and_summary_keep_the_record_format() -> None:
    stats = PixelStats.of_image(_images(1)[0])
    record = json.loads(json.dumps(stats.to_json()))
    assert list(record) == ["count", "pixels", "sum", "sumsq"]
    assert PixelStats.from_json(record) == stats
    assert list(stats.summary()) == ["mean", "std", "count"]


def test_merging_different_channel_counts_is_refused() -> None:
    gray = PixelStats.of_image(np.zeros((4, 4, 1), np.uint8))
    with pytest.raises(ValueError, match="cannot merge statistics of 3 and 1 channels"):
        PixelStats.of_image(np.zeros((4, 4, 3), np.uint8)).merge(gray)


def test_running_totals_give_the_floats_of_folding_merge_fields() -> None:
    parts = [
        {"image": PixelStats.of_image(image), "image_64": PixelStats.of_image(image[::2, ::2])}
        for image in _images(40, seed=3)
    ]
    folded: dict[str, PixelStats] = {}
    totals = StatsTotals()
    for part in parts:
        folded = merge_fields(folded, part)
        totals.add(part)
    assert totals.result() == folded  # the same additions in the same order: equal floats
    assert list(totals.result()) == ["image", "image_64"]
    assert StatsTotals().result() == {}


def test_running_totals_refuse_a_different_channel_count() -> None:
    totals = StatsTotals()
    totals.add({"image": PixelStats.of_image(_images(1)[0])})
    with pytest.raises(ValueError, match="statistics of 3 and 1 channels"):
        totals.add({"image": PixelStats.of_array(np.zeros(4, np.uint8))})
