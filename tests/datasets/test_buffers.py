"""Batch buffers are reused in the training process only once nothing refers to them."""

from __future__ import annotations

import mmap
import resource
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata.datasets._buffers as buffers_module
from fastdata import _batch_memory
from fastdata.datasets import ShardDataset, passthrough_collate
from fastdata.transforms import CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop
from tests.datasets.conftest import Reference


def _crop(image: torch.Tensor) -> torch.Tensor:
    return image[:, 1:9, 1:9]


TRANSFORMS: list[Callable[..., Any] | None] = [
    None,
    RandomHorizontalFlip(p=1.0),  # flips the gathered buffer in place
    CenterCrop(8),  # reads the stored rows, writes into a batch buffer
    RandomResizedCrop(8, seed=0),  # the same, resampled
    Compose([RandomResizedCrop(8, seed=0), RandomHorizontalFlip(p=1.0)]),  # flips it in place
    _crop,  # per sample, stacked into a buffer
]


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("hold", ["batch", "view", "numpy"])
def test_a_batch_still_held_is_never_overwritten(
    raw_shards: Reference, transform: Callable[..., Any] | None, hold: str
) -> None:
    with warnings.catch_warnings():  # the per-sample crop leaves the masks as they are
        warnings.simplefilter("ignore", UserWarning)
        dataset = ShardDataset(
            raw_shards.path, fields=("image", "label", "mask"), transform=transform
        )
    dataset.num_threads = 2
    held: list[Any] = []
    copies = []
    for start in range(0, 20, 4):
        batch = dataset.__getitems__(list(range(start, start + 4)))
        copies.append([value.clone() for value in batch])
        if hold == "view":
            batch = tuple(value[1:] for value in batch)
        elif hold == "numpy":
            batch = tuple(value.numpy() for value in batch)
        held.append(batch)
    for batch, copy in zip(held, copies, strict=True):
        for value, expected in zip(batch, copy, strict=True):
            given = torch.as_tensor(value)
            torch.testing.assert_close(given, expected[1:] if hold == "view" else expected)


def test_a_released_batch_buffer_is_reused(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label"))
    first = dataset.__getitems__([0, 1, 2, 3])
    address = first[0].data_ptr()
    second = dataset.__getitems__([4, 5, 6, 7])  # `first` is still held: another buffer
    assert second[0].data_ptr() != address
    np.testing.assert_array_equal(first[0].permute(0, 2, 3, 1), raw_shards.images[0:4])
    del first
    third = dataset.__getitems__([8, 9, 10, 11])
    assert third[0].data_ptr() == address  # released: filled again, not allocated
    np.testing.assert_array_equal(third[0].permute(0, 2, 3, 1), raw_shards.images[8:12])
    np.testing.assert_array_equal(second[0].permute(0, 2, 3, 1), raw_shards.images[4:8])


def test_batches_kept_from_a_loader_stay_intact(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"))
    for workers in (0, 2):
        loader = DataLoader(
            dataset, batch_size=4, num_workers=workers, collate_fn=passthrough_collate
        )
        kept = list(loader)  # every batch held at once
        images = torch.cat([batch[0] for batch in kept]).permute(0, 2, 3, 1)
        np.testing.assert_array_equal(images.numpy(), raw_shards.images)
        np.testing.assert_array_equal(torch.cat([b[2] for b in kept]).numpy(), raw_shards.masks)


def test_a_batch_sent_to_another_process_is_never_reused(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image",))
    batch = dataset.__getitems__([0, 1])
    batch.share_memory_()  # what sending it through a torch.multiprocessing queue does
    del batch
    assert not dataset.__getitems__([2, 3]).is_shared()  # a new buffer, not that one


Reach = Callable[[], torch.Tensor]


def _storage_only(batch: torch.Tensor) -> Reach:
    storage = batch.untyped_storage()  # no tensor kept: only the storage object
    dtype, offset, shape, stride = batch.dtype, batch.storage_offset(), batch.shape, batch.stride()
    return lambda: torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def _typed_storage_only(batch: torch.Tensor) -> Reach:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        storage = batch.storage()
    dtype, offset, shape, stride = batch.dtype, batch.storage_offset(), batch.shape, batch.stride()
    return lambda: torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def _base_only(batch: torch.Tensor) -> Reach:
    base = batch._base if batch._base is not None else batch  # the root of a view
    return lambda: base


def _tensor(tensor: torch.Tensor) -> Reach:
    return lambda: tensor


def _dlpack(batch: torch.Tensor) -> Reach:
    capsule = torch.utils.dlpack.to_dlpack(batch)
    return lambda: torch.from_dlpack(capsule)


def _memoryview(batch: torch.Tensor) -> Reach:
    view = memoryview(batch.numpy())
    return lambda: torch.from_numpy(np.asarray(view))


def _np_asarray(batch: torch.Tensor) -> Reach:
    array = np.asarray(batch)
    return lambda: torch.from_numpy(array)


# Ways a caller may keep a batch's memory without keeping the batch.
HOLDS: dict[str, Callable[[torch.Tensor], Reach]] = {
    "untyped_storage": _storage_only,
    "typed_storage": _typed_storage_only,
    "view_base": _base_only,
    "detach": lambda batch: _tensor(batch.detach()),
    "data": lambda batch: _tensor(batch.data),
    "as_strided": lambda batch: _tensor(batch.as_strided(batch.shape, batch.stride())),
    "dlpack": _dlpack,
    "memoryview": _memoryview,
    "np_asarray": _np_asarray,
}


@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_memory_reached_any_way_is_never_reused(raw_shards: Reference, hold: str) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image",), layout="HWC")
    batch = dataset.__getitems__([0, 1, 2, 3])
    reach = HOLDS[hold](batch.as_subclass(torch.Tensor))
    del batch
    for start in (4, 8, 12):  # every later batch of the same shape
        dataset.__getitems__(list(range(start, start + 4)))
    np.testing.assert_array_equal(reach().numpy(), raw_shards.images[0:4])


def test_threads_never_share_a_buffer_still_held(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "mask"), num_threads=1)
    errors: list[str] = []

    def read(first: int) -> None:
        held = []
        for round_ in range(30):
            start = (first + round_) % (len(dataset) - 4)
            held.append((start, dataset.__getitems__(list(range(start, start + 4)))))
            if len(held) > 3:
                held.pop(0)
            for begin, (images, masks) in held:
                if not np.array_equal(
                    images.permute(0, 2, 3, 1).numpy(), raw_shards.images[begin : begin + 4]
                ) or not np.array_equal(masks.numpy(), raw_shards.masks[begin : begin + 4]):
                    errors.append(f"batch from {begin} changed")

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread page-fault counts: Linux")
def test_a_workers_shared_batch_is_faulted_in_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch a worker sends is resident when handed over: writing it does not fault its
    pages in one by one (the kernel's work per batch)."""
    monkeypatch.setattr(buffers_module, "get_worker_info", object)  # as in a worker
    if not getattr(_batch_memory, "_populate_works", True):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    batch = buffers_module.BatchBuffers().empty((4, 3, 256, 256), torch.uint8, returned=True)
    assert batch.is_shared()
    pages = batch.numel() // mmap.PAGESIZE
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    batch.fill_(7)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    assert faults < pages // 10, (faults, pages)


def test_a_workers_scratch_batch_is_reused_in_the_worker(
    raw_shards: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch only a per-sample transform reads never leaves the worker: it is reused
    there as in the training process, not allocated (and faulted in) per batch."""
    monkeypatch.setattr(buffers_module, "get_worker_info", object)  # as in a worker
    dataset = ShardDataset(raw_shards.path, fields=("image",), transform=_crop, num_threads=1)
    for start in (0, 4, 8):
        batch = dataset.__getitems__(list(range(start, start + 4)))
        expected = raw_shards.images[start : start + 4, 1:9, 1:9].transpose(0, 3, 1, 2)
        np.testing.assert_array_equal(batch.numpy(), expected)
    pools = dataset._buffers._local.__dict__.get("pools", {})
    assert ((4, *raw_shards.images.shape[1:]), torch.uint8) in pools  # the gathered rows


def test_three_fields_and_a_partial_last_batch_reuse_their_buffers(
    raw_shards: Reference,
) -> None:
    # image, label and mask: three buffers per batch, in two batch sizes (5 full batches
    # of 4 and the last one of 2 of the 22 samples), six shapes in all.
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"))
    loader = dataset.loader(batch_size=4, shuffle=True)
    allocations = []
    for _ in range(3):
        for batch in loader:  # each batch let go of when the loop takes the next
            assert [len(value) for value in batch] in ([4] * 3, [2] * 3)
        allocations.append(dataset._buffers.allocations)
    # the first epoch fills the pools (two buffers per shape: the batch the loop holds
    # and the next one); the later epochs take every batch from them
    assert allocations[0] <= 2 * 6
    assert allocations[1] == allocations[2] == allocations[0]


def test_buffers_per_batch_is_checked() -> None:
    with pytest.raises(TypeError, match=r"buffers_per_batch must be an int, got 2.0"):
        buffers_module.BatchBuffers(2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"buffers_per_batch must be at least 1, got 0"):
        buffers_module.BatchBuffers(0)
