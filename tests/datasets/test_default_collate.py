"""Batches work with DataLoader's default collate; per-sample transforms get (C, H, W)."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import (
    RAMDataset,
    ResumableDataLoader,
    ShardAwareDistributedSampler,
    ShardDataset,
    passthrough_collate,
)
from tests.datasets.conftest import Reference


def _batches(loader: DataLoader) -> list[tuple]:
    return [batch if isinstance(batch, tuple) else (batch,) for batch in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_hands_the_batch_on(raw_shards: Reference, num_workers: int) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"))
    loader = DataLoader(dataset, batch_size=8, num_workers=num_workers)  # no collate_fn
    reference = DataLoader(dataset, batch_size=8, collate_fn=passthrough_collate)
    got, want = _batches(loader), _batches(reference)
    assert len(got) == len(want) == 3
    for batch, expected in zip(got, want, strict=True):
        images, labels, _masks = batch
        assert images.shape == (len(labels), 3, 12, 10) and images.dtype == torch.uint8
        assert type(images) is torch.Tensor and type(labels) is torch.Tensor  # plain again
        for value, other in zip(batch, expected, strict=True):
            assert torch.equal(value, other)
    images = torch.cat([b[0] for b in got]).permute(0, 2, 3, 1)
    assert torch.equal(images, torch.from_numpy(raw_shards.images))


def test_default_collate_with_ram_encoded_and_single_fields(
    raw_shards: Reference, encoded_shards: Reference
) -> None:
    ram = RAMDataset.from_shards(raw_shards.path, fields=("label",), show_progress=False)
    labels = torch.cat(list(DataLoader(ram, batch_size=5)))
    assert labels.tolist() == raw_shards.labels.tolist()
    encoded = ShardDataset(encoded_shards.path, decode=False)
    data, labels = next(iter(DataLoader(encoded, batch_size=4)))
    assert type(data) is list and [bytes(d.numpy()) for d in data] == encoded_shards.jpegs[:4]
    only = ShardDataset(encoded_shards.path, fields=("image",), decode=False)
    for collate in (None, passthrough_collate):
        data = next(iter(DataLoader(only, batch_size=3, collate_fn=collate)))
        assert [bytes(d.numpy()) for d in data] == encoded_shards.jpegs[:3]
        assert all(type(d) is torch.Tensor for d in data)


def test_loader_convenience(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label"))
    sampler = ShardAwareDistributedSampler(dataset, 1, 0, seed=0)
    loader = dataset.loader(batch_size=4, sampler=sampler)
    assert isinstance(loader, ResumableDataLoader) and loader.collate_fn is passthrough_collate
    images, _labels = next(iter(loader))
    assert images.shape == (4, 3, 12, 10)
    assert loader.state_dict()["sampler"]["num_consumed"] == 4


def _crop_chw(seen: list[tuple[int, ...]]):
    def crop(image: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(image.shape))
        return image[:, 2:10, 1:7]  # (C, H, W) convention, as torchvision's

    return crop


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_per_sample_transform_gets_chw_whatever_the_layout(
    raw_shards: Reference, layout: str
) -> None:
    seen: list[tuple[int, ...]] = []
    dataset = ShardDataset(raw_shards.path, transform=_crop_chw(seen), layout=layout)
    images, _labels = dataset.__getitems__([0, 5, 9])
    assert set(seen) == {(3, 12, 10)}
    expected = torch.from_numpy(raw_shards.images[[0, 5, 9], 2:10, 1:7])  # (B, H, W, C)
    if layout == "CHW":
        assert images.shape == (3, 3, 8, 6)
        assert torch.equal(images, expected.permute(0, 3, 1, 2))
    else:
        assert images.shape == (3, 8, 6, 3)
        assert torch.equal(images, expected)
    single, _ = dataset[5]
    assert single.shape == ((3, 8, 6) if layout == "CHW" else (8, 6, 3))
    assert torch.equal(single, images[1])


def test_per_sample_transform_mistakes_are_clear_errors(raw_shards: Reference) -> None:
    sizes = iter([8, 6, 8, 6])
    uneven = ShardDataset(raw_shards.path, transform=lambda x: x[:, : next(sizes)])
    with pytest.raises(ValueError, match="returned samples of different shapes"):
        uneven.__getitems__([0, 1])
    not_tensor = ShardDataset(raw_shards.path, transform=lambda x: x.tolist())
    with pytest.raises(TypeError, match="returned list; a per-sample transform must return"):
        not_tensor.__getitems__([0, 1])


def _saved_and_loaded(value: object) -> object:
    stream = io.BytesIO()
    torch.save(value, stream)
    stream.seek(0)
    return torch.load(stream)  # weights_only: only plain tensors and parameters load


def test_a_batch_from_getitems_works_as_any_tensor(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label"), layout="HWC")
    images, _labels = dataset.__getitems__([0, 1, 2, 3])
    expected = torch.from_numpy(raw_shards.images[0:4])
    frozen = torch.nn.Parameter(images, requires_grad=False)
    trained = torch.nn.Parameter(images.float())
    assert isinstance(frozen, torch.nn.Parameter) and not frozen.requires_grad
    assert torch.equal(frozen, expected) and frozen.data_ptr() == images.data_ptr()
    model = torch.nn.Module()
    model.frozen, model.trained = frozen, trained
    model.register_buffer("held", images)
    for copied in (
        copy.deepcopy(images),
        pickle.loads(pickle.dumps(images)),
        _saved_and_loaded(images),
        images.detach().clone(),
    ):
        assert type(copied) is torch.Tensor and torch.equal(copied, expected)
    for param in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(frozen))):
        assert type(param) is torch.nn.Parameter and torch.equal(param, expected)
    state = _saved_and_loaded(model.state_dict())
    assert isinstance(state, dict) and torch.equal(state["frozen"], expected)
    assert type(copy.deepcopy(model).frozen) is torch.nn.Parameter
    np.testing.assert_array_equal(images.numpy(), raw_shards.images[0:4])
    assert repr(images) == repr(expected)
    sample = images[1]  # a sample of the batch works the same
    assert torch.equal(torch.nn.Parameter(sample, requires_grad=False), expected[1])
    for copied in (copy.deepcopy(sample), _saved_and_loaded(sample)):
        assert type(copied) is torch.Tensor and torch.equal(copied, expected[1])
    del images, _labels
    for start in (4, 8, 12):  # later batches of the shape never write into the parameter
        dataset.__getitems__(list(range(start, start + 4)))
    assert torch.equal(frozen, expected) and torch.equal(model.held, expected)
