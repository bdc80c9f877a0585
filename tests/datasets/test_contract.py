"""The contract every fastdata dataset keeps, checked pixel-exact against NumPy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from fastdata.datasets import RAMDataset, ShardDataset, passthrough_collate
from fastdata.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop
from tests.datasets.conftest import NUM_SAMPLES, Reference

Factory = Callable[[Reference], Dataset]


def _files(ref: Reference) -> RAMDataset:
    folder = ref.path.parent / "files"
    folder.mkdir(exist_ok=True)
    paths = []
    for i, data in enumerate(ref.jpegs):
        paths.append(folder / f"{i:03d}.png")
        paths[-1].write_bytes(data)
    return RAMDataset(paths, ref.labels, show_progress=False)


FACTORIES: dict[str, tuple[str, Factory]] = {
    "shard": ("raw_shards", lambda ref: ShardDataset(ref.path)),
    "shard-encoded": ("encoded_shards", lambda ref: ShardDataset(ref.path)),
    "ram-shards": ("raw_shards", lambda ref: RAMDataset.from_shards(ref.path, show_progress=False)),
    "ram-shards-encoded": (
        "encoded_shards",
        lambda ref: RAMDataset.from_shards(ref.path, show_progress=False),
    ),
    "ram-arrays": ("raw_shards", lambda ref: RAMDataset.from_arrays(ref.images, ref.labels)),
    "ram-files": ("raw_shards", _files),
}


@pytest.fixture(params=sorted(FACTORIES))
def case(request: pytest.FixtureRequest) -> tuple[Dataset, Reference]:
    fixture, factory = FACTORIES[request.param]
    ref = request.getfixturevalue(fixture)
    return factory(ref), ref


def _images(batch: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) → (B, H, W, C) NumPy for comparison with the reference."""
    return batch.permute(0, 2, 3, 1).numpy()


def _epoch(loader: DataLoader) -> tuple[np.ndarray, np.ndarray]:
    images, labels = zip(*loader, strict=True)
    return _images(torch.cat(images)), torch.cat(labels).numpy()


def test_length(case: tuple[Dataset, Reference]) -> None:
    dataset, _ = case
    assert len(dataset) == NUM_SAMPLES


def test_indexing_is_pixel_exact(case: tuple[Dataset, Reference]) -> None:
    dataset, ref = case
    for index in (0, 9, NUM_SAMPLES - 1, -1):
        image, label = dataset[index]
        assert image.dtype == torch.uint8 and image.shape == (3, *ref.images.shape[1:3])
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), ref.images[index])
        assert label.dtype == torch.int64 and int(label) == ref.labels[index]


def test_out_of_range_and_bad_index(case: tuple[Dataset, Reference]) -> None:
    dataset, _ = case
    with pytest.raises(IndexError, match=f"out of range for {NUM_SAMPLES} samples"):
        dataset[NUM_SAMPLES]
    with pytest.raises(TypeError, match="index must be an int, got str"):
        dataset["0"]


def test_batched_equals_single(case: tuple[Dataset, Reference]) -> None:
    dataset, ref = case
    indices = [21, 3, 9, 3, 0, 17]  # across shards, unsorted, repeated
    images, labels = dataset.__getitems__(indices)
    assert images.shape == (6, 3, *ref.images.shape[1:3]) and labels.shape == (6,)
    singles = [dataset[i] for i in indices]
    np.testing.assert_array_equal(
        _images(images), np.stack([_images(s[0][None])[0] for s in singles])
    )
    np.testing.assert_array_equal(labels.numpy(), ref.labels[indices])
    np.testing.assert_array_equal(_images(images), ref.images[indices])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_epoch_in_order(case: tuple[Dataset, Reference], num_workers: int) -> None:
    dataset, ref = case
    loader = DataLoader(
        dataset, batch_size=5, num_workers=num_workers, collate_fn=passthrough_collate
    )
    images, labels = _epoch(loader)
    np.testing.assert_array_equal(images, ref.images)
    np.testing.assert_array_equal(labels, ref.labels)


def test_shuffle_is_deterministic_under_seed(case: tuple[Dataset, Reference]) -> None:
    dataset, ref = case

    def run() -> np.ndarray:
        loader = DataLoader(
            dataset,
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(7),
            collate_fn=passthrough_collate,
        )
        images, labels = _epoch(loader)
        order = [
            int(np.flatnonzero((ref.images == image).all(axis=(1, 2, 3)))[0]) for image in images
        ]
        np.testing.assert_array_equal(labels, ref.labels[order])
        return np.array(order)

    first = run()
    np.testing.assert_array_equal(first, run())
    assert sorted(first.tolist()) == list(range(NUM_SAMPLES))


def test_distributed_sampler_partitions(case: tuple[Dataset, Reference]) -> None:
    dataset, ref = case
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=3)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=passthrough_collate)
        images, labels = _epoch(loader)
        expected = list(sampler)
        np.testing.assert_array_equal(images, ref.images[expected])
        np.testing.assert_array_equal(labels, ref.labels[expected])
        seen += expected
    assert sorted(seen) == list(range(NUM_SAMPLES))


@pytest.mark.parametrize(("name", "context"), [("shard", "spawn"), ("ram-files", "forkserver")])
def test_spawned_persistent_workers(
    name: str, context: str, request: pytest.FixtureRequest
) -> None:
    fixture, factory = FACTORIES[name]
    ref = request.getfixturevalue(fixture)
    loader = DataLoader(
        factory(ref),
        batch_size=6,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
        collate_fn=passthrough_collate,
    )
    for _ in range(2):  # the second epoch reuses the workers and their open handles
        images, labels = _epoch(loader)
        np.testing.assert_array_equal(images, ref.images)
        np.testing.assert_array_equal(labels, ref.labels)


def test_augmented_epochs_reproduce_per_worker(raw_shards: Reference) -> None:
    train = Compose([RandomResizedCrop(8), RandomHorizontalFlip()])
    dataset = ShardDataset(raw_shards.path, transform=train)

    def run(seed: int) -> np.ndarray:
        torch.manual_seed(seed)  # DataLoader derives each worker's seed from this
        loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=passthrough_collate)
        return _epoch(loader)[0]

    first = run(1)
    assert first.shape == (NUM_SAMPLES, 8, 8, 3)
    np.testing.assert_array_equal(first, run(1))
    assert not np.array_equal(first, run(2))
