"""In DataLoader workers, batch transforms of a fixed output size write into the shared
memory the batch is returned in."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import RAMDataset, ShardDataset, _base, _buffers, passthrough_collate
from fastdata.transforms import (
    BatchTransform,
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from fastdata.transforms._base import Images
from tests.datasets.conftest import Reference

FACTORIES: dict[str, Callable[[], BatchTransform]] = {
    "rrc": lambda: RandomResizedCrop(8, seed=3),
    "center": lambda: CenterCrop((8, 6)),
    "resize": lambda: Resize(7),
    "rrc+flip": lambda: Compose([RandomResizedCrop(8, seed=3), RandomHorizontalFlip(seed=4)]),
    "flip+center": lambda: Compose([RandomHorizontalFlip(seed=4), CenterCrop(8)]),
}


def _dataset(kind: str, reference: Reference, transform: BatchTransform, masks: bool) -> Any:
    fields = ("image", "label", "mask") if masks else ("image", "label")
    if kind == "shard":
        return ShardDataset(reference.path, fields=fields, transform=transform)
    return RAMDataset.from_shards(reference.path, fields=fields, transform=transform)


def _allocating(dataset: Any) -> Any:
    """``dataset`` with its transform allocating its own output, as before ``out``."""
    dataset.plan = dataclasses.replace(dataset.plan, writes_out=False)
    return dataset


def _batches(dataset: Any, threads: int) -> list[tuple[torch.Tensor, ...]]:
    dataset.num_threads = threads
    return [dataset.__getitems__(list(range(s, s + 5))) for s in range(0, 20, 5)]


@pytest.fixture
def in_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``__getitems__`` as inside a DataLoader worker (any batch in shared memory)."""
    monkeypatch.setattr(_buffers, "_SHARED_MIN_BYTES", 0)
    monkeypatch.setattr(_buffers, "get_worker_info", object)  # non-None
    monkeypatch.setattr(_base, "get_worker_info", object)


@pytest.mark.parametrize("name", FACTORIES)
@pytest.mark.parametrize("kind", ["shard", "ram"])
@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.usefixtures("in_worker")
def test_outputs_written_into_the_returned_batch_are_unchanged(
    raw_shards: Reference, name: str, kind: str, masks: bool, threads: int
) -> None:
    dataset = _dataset(kind, raw_shards, FACTORIES[name](), masks)
    assert dataset.plan.writes_out
    expected = _batches(_allocating(_dataset(kind, raw_shards, FACTORIES[name](), masks)), threads)
    for batch, reference in zip(_batches(dataset, threads), expected, strict=True):
        assert batch[0].untyped_storage().is_shared()  # no copy when sent to the main process
        for value, want in zip(batch, reference, strict=True):
            assert value.dtype == want.dtype and value.shape == want.shape
            assert torch.equal(value, want)


@pytest.mark.parametrize("name", ["rrc+flip", "center"])
def test_the_training_process_keeps_the_transforms_own_output(
    raw_shards: Reference, name: str
) -> None:
    dataset = _dataset("shard", raw_shards, FACTORIES[name](), masks=True)
    expected = _batches(_allocating(_dataset("shard", raw_shards, FACTORIES[name](), True)), 2)
    got = _batches(dataset, 2)
    pools = dataset._buffers._local.__dict__.get("pools", {})
    pooled = {kept.data_ptr() for pool in pools.values() for kept in pool}
    assert got[0][0].data_ptr() not in pooled  # NumPy's allocation (huge pages), kept
    for batch, reference in zip(got, expected, strict=True):
        for value, want in zip(batch, reference, strict=True):
            assert torch.equal(value, want)


@pytest.mark.parametrize("masks", [False, True])
def test_loader_workers_give_the_same_batches(raw_shards: Reference, masks: bool) -> None:
    def batches(dataset: Any) -> list[Any]:
        loader = DataLoader(
            dataset, batch_size=4, num_workers=2, collate_fn=passthrough_collate, drop_last=True
        )
        return list(loader)

    factory = FACTORIES["rrc+flip"]
    expected = batches(_allocating(_dataset("shard", raw_shards, factory(), masks)))
    got = batches(_dataset("shard", raw_shards, factory(), masks))
    assert len(got) == len(expected) == 5
    for batch, reference in zip(got, expected, strict=True):
        for value, want in zip(batch, reference, strict=True):
            assert torch.equal(value, want)


class _OldStyleCrop(BatchTransform):
    """A user transform written before ``out``: its apply_all takes no such argument."""

    keeps_size = False
    in_place = False

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return (6, 6)

    def apply_all(
        self, images: Images, masks: Sequence[Images], executor: Executor | None, tasks: int
    ) -> tuple[Images, list[Images]]:
        return np.ascontiguousarray(np.asarray(images)[:, :6, :6]), [
            np.asarray(m)[:, :6, :6] for m in masks
        ]


@pytest.mark.parametrize(
    "transform",
    [_OldStyleCrop(), Compose([_OldStyleCrop(), RandomHorizontalFlip(p=1.0)])],
    ids=["alone", "in-compose"],
)
def test_a_transform_without_out_still_works(
    raw_shards: Reference, transform: BatchTransform
) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"), transform=transform)
    assert not dataset.plan.writes_out
    images, _, masks = dataset.__getitems__([3, 4])
    flip = (slice(None), slice(None), slice(None, None, -1))
    want = raw_shards.images[3:5, :6, :6]
    want_masks = raw_shards.masks[3:5, :6, :6]
    if isinstance(transform, Compose):
        want, want_masks = want[flip], want_masks[flip]
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), want)
    np.testing.assert_array_equal(masks.numpy(), want_masks)


def test_compose_gives_out_to_its_last_resizing_step_only() -> None:
    assert Compose([RandomResizedCrop(8), RandomHorizontalFlip()]).writes_out
    assert Compose([CenterCrop(8), _OldStyleCrop()]).writes_out is False
    assert Compose([RandomHorizontalFlip()]).writes_out is False
    images = np.random.default_rng(0).integers(0, 256, (3, 12, 10, 3), dtype=np.uint8)
    out = np.empty((3, 8, 8, 3), np.uint8)
    compose = Compose([Resize(9), CenterCrop(8), RandomHorizontalFlip(p=1.0)])
    result, _ = compose.apply_all(images.copy(), [], None, 1, out=out)
    assert result is out
    expected = Compose([Resize(9), CenterCrop(8), RandomHorizontalFlip(p=1.0)])(images.copy())
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "out",
    [
        np.empty((3, 8, 7, 3), np.uint8),
        np.empty((3, 8, 8, 3), np.int16),
        np.empty((3, 8, 16, 3), np.uint8)[:, :, ::2],
    ],
    ids=["shape", "dtype", "strided"],
)
def test_a_wrong_out_is_refused(out: np.ndarray) -> None:
    images = np.zeros((3, 12, 10, 3), np.uint8)
    for transform in (RandomResizedCrop(8), CenterCrop(8), Resize((8, 8))):
        with pytest.raises(ValueError, match="out must be a C-contiguous"):
            transform.apply_all(images, [], None, 1, out=out)


def test_resize_to_varying_sizes_refuses_out() -> None:
    images = [np.zeros((12, 10, 3), np.uint8), np.zeros((10, 12, 3), np.uint8)]
    with pytest.raises(ValueError, match="different sizes"):
        Resize(8).apply_all(images, [], None, 1, out=np.empty((2, 9, 8, 3), np.uint8))
