"""``dataset.loader(...)``: the epoch of each batch reaches the transform's draws."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from fastdata.datasets import ShardAwareDistributedSampler, ShardDataset
from fastdata.datasets._loader import EpochBatch
from fastdata.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop
from tests.datasets.conftest import NUM_SAMPLES, Reference

FORWARD = list(range(NUM_SAMPLES))


def _dataset(ref: Reference) -> ShardDataset:
    train = Compose([RandomResizedCrop(8, scale=(0.1, 1.0), seed=3), RandomHorizontalFlip(seed=4)])
    return ShardDataset(ref.path, fields=("image",), transform=train, num_threads=1)


def _epoch(loader: Any, order: Sequence[int]) -> np.ndarray:
    """One epoch's crops, ``(N, 3, 8, 8)`` uint8, put back in sample-index order."""
    batches = np.concatenate([batch.numpy() for batch in loader])
    crops = np.empty_like(batches)
    crops[np.asarray(order)] = batches
    return crops


def _epochs(ref: Reference, count: int, order: Sequence[int] = FORWARD, **kwargs: Any) -> list:
    loader = _dataset(ref).loader(sampler=order, **{"batch_size": 4, **kwargs})
    return [_epoch(loader, order) for _ in range(count)]


@pytest.fixture
def reference(raw_shards: Reference) -> list[np.ndarray]:
    """Three epochs of seeded crops read without workers."""
    return _epochs(raw_shards, 3)


@pytest.mark.parametrize(
    "settings",
    [
        {"num_workers": 0},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 1, "batch_size": 5},
    ],
    ids=["rerun", "workers", "persistent", "persistent-batch5"],
)
def test_seeded_crops_change_each_epoch_and_repeat_on_a_rerun(
    raw_shards: Reference, reference: list[np.ndarray], settings: dict[str, Any]
) -> None:
    first, second, third = reference
    assert not np.array_equal(first, second) and not np.array_equal(second, third)
    epochs = _epochs(raw_shards, 3, **settings)
    assert not np.array_equal(epochs[0], epochs[1])  # workers made afresh: still new crops
    # the same seed and epoch give the same crops whatever the loader's settings
    for epoch, crops in enumerate(epochs):
        np.testing.assert_array_equal(crops, reference[epoch], err_msg=f"epoch {epoch}")


def test_a_samples_crop_does_not_depend_on_its_batch(
    raw_shards: Reference, reference: list[np.ndarray]
) -> None:
    backward = FORWARD[::-1]
    crops = _epochs(raw_shards, 2, backward, batch_size=5, num_workers=2)
    np.testing.assert_array_equal(crops[1], reference[1])


def test_the_epoch_comes_from_the_sampler_or_set_epoch(
    raw_shards: Reference, reference: list[np.ndarray]
) -> None:
    dataset = _dataset(raw_shards)
    sampler = ShardAwareDistributedSampler(raw_shards.path, 1, 0, shuffle=False)
    loader = dataset.loader(batch_size=4, sampler=sampler, num_workers=2)
    sampler.set_epoch(2)
    np.testing.assert_array_equal(_epoch(loader, FORWARD), reference[2])
    assert _epoch(loader, FORWARD).tobytes() == reference[2].tobytes()  # still epoch 2
    plain = dataset.loader(batch_size=4, sampler=FORWARD)
    plain.set_epoch(1)
    np.testing.assert_array_equal(_epoch(plain, FORWARD), reference[1])
    np.testing.assert_array_equal(_epoch(plain, FORWARD), reference[2])  # then counts on
    with pytest.raises(TypeError, match=r"epoch must be an int, got 1\.0"):
        plain.set_epoch(1.0)  # type: ignore[arg-type]


def test_a_resumed_loader_goes_on_with_the_saved_epoch(
    raw_shards: Reference, reference: list[np.ndarray]
) -> None:
    loader = _dataset(raw_shards).loader(batch_size=4, sampler=FORWARD)
    for _ in range(2):
        _epoch(loader, FORWARD)
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    assert state["epoch"] == 1
    resumed = _dataset(raw_shards).loader(batch_size=4, sampler=FORWARD, num_workers=2)
    resumed.load_state_dict(state)  # no sampler state: the epoch restarts, the saved one
    np.testing.assert_array_equal(_epoch(resumed, FORWARD), reference[1])
    np.testing.assert_array_equal(_epoch(resumed, FORWARD), reference[2])


def test_epoch_batches_are_lists_that_pickle_with_their_epoch() -> None:
    batch = EpochBatch([3, 1, 2], 7)
    copy = pickle.loads(pickle.dumps(batch))
    assert copy == [3, 1, 2] and isinstance(copy, list) and copy.epoch == 7
