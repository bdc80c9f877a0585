"""Variable-length fields in loader batches: lists by default, padded + counts on request,
and both moved by the device prefetcher."""

from __future__ import annotations

import math
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing  # registers the tensor reductions a worker uses

import fastdata.datasets._collate as collate_module
from fastdata import ShardDataset
from fastdata.datasets import RaggedCollate, pad_ragged, passthrough_collate
from fastdata.gpu import DevicePrefetcher
from tests.shards.test_ragged import COUNTS, write_detection_set


def test_pad_ragged_against_numpy() -> None:
    items = [torch.arange(6.0).reshape(3, 2), torch.zeros(0, 2), torch.ones(1, 2)]
    padded, counts = pad_ragged(items, pad_value=-1)
    expected = np.full((3, 3, 2), -1.0, np.float32)
    expected[0] = np.arange(6.0).reshape(3, 2)
    expected[2, 0] = 1
    np.testing.assert_array_equal(padded.numpy(), expected)
    assert counts.tolist() == [3, 0, 1] and counts.dtype == torch.int64
    with pytest.raises(ValueError, match="share their row shape"):
        pad_ragged([torch.zeros(1, 2), torch.zeros(1, 3)])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_loader_lists_or_pads(tmp_path: Path, num_workers: int) -> None:
    expected = write_detection_set(tmp_path)
    dataset = ShardDataset(tmp_path, fields=("label", "boxes", "labels"))
    listed = next(iter(dataset.loader(batch_size=7, num_workers=num_workers)))
    assert [len(b) for b in listed[1]] == COUNTS
    padded_loader = dataset.loader(batch_size=7, ragged="padded", num_workers=num_workers)
    labels, (boxes, counts), (box_labels, label_counts) = next(iter(padded_loader))
    assert tuple(boxes.shape) == (7, max(COUNTS), 4)
    assert counts.tolist() == COUNTS == label_counts.tolist()
    for i, count in enumerate(COUNTS):
        np.testing.assert_array_equal(boxes[i, :count].numpy(), expected["boxes"][i])
        assert (boxes[i, count:] == 0).all()
        np.testing.assert_array_equal(box_labels[i, :count].numpy(), expected["labels"][i])
    assert labels.tolist() == list(range(7))


def test_ragged_argument_is_checked(tmp_path: Path) -> None:
    write_detection_set(tmp_path)
    dataset = ShardDataset(tmp_path, fields=("label", "boxes"))
    with pytest.raises(ValueError, match="ragged must be one of"):
        dataset.loader(batch_size=2, ragged="pad")
    with pytest.raises(ValueError, match="not both"):
        dataset.loader(batch_size=2, ragged="padded", collate_fn=lambda b: b)
    with pytest.raises(ValueError, match="ragged must be one of"):
        RaggedCollate("stacked")


@pytest.mark.parametrize("ragged", ["list", "padded"])
def test_the_prefetcher_moves_both_forms(tmp_path: Path, ragged: str) -> None:
    write_detection_set(tmp_path)
    dataset = ShardDataset(tmp_path, fields=("image", "boxes", "labels"))
    loader = dataset.loader(batch_size=4, ragged=ragged)
    seen: list[torch.Tensor] = []

    def record(batch: object) -> object:
        # the prefetcher's transform gets the batch after the move: every tensor is there
        stack: list[object] = [batch]
        while stack:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                seen.append(item)
            elif isinstance(item, tuple | list):
                stack.extend(item)
        return batch

    batches = list(DevicePrefetcher(loader, "cpu", transform=record))
    assert len(batches) == 2
    if ragged == "list":
        assert isinstance(batches[0][1], list) and len(batches[0][1]) == 4
        assert len(seen) == (1 + 4 + 4) + (1 + 3 + 3)  # 7 samples: batches of 4 and 3
    else:
        boxes, counts = batches[0][1]
        assert tuple(boxes.shape)[::2] == (4, 4) and counts.tolist() == COUNTS[:4]
        assert len(seen) == 2 * (1 + 2 + 2)  # image, (boxes, counts), (labels, counts)
    assert all(t.device.type == "cpu" for t in seen)


def test_a_worker_sends_each_ragged_field_as_one_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of a DataLoader worker, a batch's boxes and box labels are pickled as one buffer
    per field (not one shared-memory segment per sample) and arrive as plain lists of
    tensors with the same values, empty ones included."""
    write_detection_set(tmp_path)
    dataset = ShardDataset(tmp_path, fields=("label", "boxes", "labels"))
    expected = dataset.__getitems__(list(range(7)))
    monkeypatch.setattr(collate_module, "get_worker_info", object)  # as in a worker
    batch = dataset.__getitems__(list(range(7)))
    received = pickle.loads(ForkingPickler.dumps(batch))
    for position in (1, 2):
        assert not any(item.is_shared() for item in batch[position])  # nothing per sample
        assert type(received[position]) is list
        assert [tuple(t.shape) for t in received[position]] == [
            tuple(t.shape) for t in expected[position]
        ]
        for got, want in zip(received[position], expected[position], strict=True):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert 0 in COUNTS  # an empty sample travels too


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.bool])
def test_a_worker_sends_a_list_of_any_dtype_as_one_buffer(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Lists of tensors of dtypes NumPy lacks (bfloat16) travel too, values unchanged."""
    images = torch.zeros(3, 3, 4, 4, dtype=torch.uint8)
    values = [(torch.arange(count * 4) % 5).to(dtype).reshape(count, 4) for count in (2, 0, 3)]
    monkeypatch.setattr(collate_module, "get_worker_info", object)  # as in a worker
    received = pickle.loads(ForkingPickler.dumps(passthrough_collate((images, values))))
    assert type(received[1]) is list and len(received[1]) == 3
    for got, want in zip(received[1], values, strict=True):
        assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want)


def test_passthrough_collate_packs_a_plain_datasets_ragged_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dataset of one's own whose ``__getitems__`` returns (images, boxes list, labels
    list) gets the same one-buffer trip out of a worker through ``passthrough_collate``."""
    images = torch.zeros(3, 3, 4, 4, dtype=torch.uint8)
    boxes = [torch.rand(count, 4) for count in (2, 0, 3)]
    labels = [torch.arange(count) for count in (2, 0, 3)]
    monkeypatch.setattr(collate_module, "get_worker_info", object)  # as in a worker
    batch = passthrough_collate((images, boxes, labels))
    received = pickle.loads(ForkingPickler.dumps(batch))
    assert not any(item.is_shared() for item in [*boxes, *labels])
    assert type(received[1]) is list and type(received[2]) is list
    for got, want in zip([*received[1], *received[2]], [*boxes, *labels], strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.bool, torch.float32])
@pytest.mark.parametrize("shape", [(7,), (7, 3), (0,), ()])
def test_a_worker_sends_a_batchs_small_tensors_as_bytes(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    """Out of a DataLoader worker, a batch's labels (a small tensor after the first field)
    travel inside the queue message, not in a shared-memory segment of their own, and
    arrive as a plain tensor of the same values, dtype and shape; the first field (which
    marks the batch collated) and large tensors travel as before."""
    images = torch.zeros(7, 3, 4, 4, dtype=torch.uint8)
    labels = (torch.arange(math.prod(shape)) % 3).to(dtype).reshape(shape)
    monkeypatch.setattr(collate_module, "get_worker_info", object)  # as in a worker
    batch = passthrough_collate((images, labels))
    received = pickle.loads(ForkingPickler.dumps(batch))
    assert not labels.is_shared()  # left where it was: copied into the message
    assert batch[0].is_shared()  # the images: shared memory, as torch sends them
    assert type(received[1]) is torch.Tensor
    assert received[1].dtype == dtype and received[1].shape == labels.shape
    torch.testing.assert_close(received[1], labels, rtol=0, atol=0)
    assert torch.equal(batch[1] + 1, labels + 1)  # in the worker it works as the tensor
    big = torch.zeros(1 << 19, dtype=torch.int64)  # 4 MB: over the limit, shared memory
    received = pickle.loads(ForkingPickler.dumps(passthrough_collate((images, big))))
    assert big.is_shared() and received[1].is_shared()
