"""Workers of ``dataset.loader(...)`` reuse a batch's shared memory only once the training
process holds nothing of it; a caller who keeps batches gets fresh memory and intact data."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import (
    ShardAwareDistributedSampler,
    ShardDataset,
    _base,
    _buffers,
    _slots,
    passthrough_collate,
)
from fastdata.datasets._loader import EpochBatch, ResumableDataLoader
from tests.datasets.conftest import Reference

WORKERS = 2
PREFETCH = 2
CAPACITY = PREFETCH + 2  # the ring each worker keeps per batch shape


@pytest.fixture(autouse=True)
def small_batches_in_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixtures' batches are small: send them as large ones are (forked workers
    inherit the patch)."""
    monkeypatch.setattr(_buffers, "_SHARED_MIN_BYTES", 0)


def _loader(raw_shards: Reference, **kwargs: Any) -> ResumableDataLoader:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"), layout="HWC")
    options: dict[str, Any] = {"batch_size": 1, "num_workers": WORKERS, "prefetch_factor": PREFETCH}
    return dataset.loader(**(options | kwargs))


def _releaser(iterator: Any) -> _slots.SlotReleaser:
    releaser = iterator._inner._slots  # the test hook: what the training process counted
    assert isinstance(releaser, _slots.SlotReleaser)
    return releaser


def _check(batch: Any, reference: Reference, indices: list[int]) -> None:
    images, labels, masks = (torch.as_tensor(value) for value in batch)
    np.testing.assert_array_equal(images.numpy(), reference.images[indices])
    np.testing.assert_array_equal(labels.numpy(), reference.labels[indices])
    np.testing.assert_array_equal(masks.numpy(), reference.masks[indices])


@pytest.mark.parametrize("in_order", [True, False])
def test_batches_kept_for_a_whole_epoch_are_all_intact(
    raw_shards: Reference, in_order: bool
) -> None:
    iterator = iter(_loader(raw_shards, in_order=in_order))
    kept = list(iterator)  # every slot stays held: the workers fall back to fresh memory
    assert len(kept) == len(raw_shards.images)
    if not in_order:
        kept.sort(
            key=lambda batch: int(
                np.flatnonzero((raw_shards.masks == batch[2].numpy()).all(axis=(1, 2)))[0]
            )
        )
    for index, batch in enumerate(kept):
        _check(batch, raw_shards, [index])
    releaser = _releaser(iterator)
    assert releaser.reuses == 0
    # three fields, each worker's ring filled once (out of order, a worker may take fewer)
    assert releaser.arrivals % 3 == 0 and 0 < releaser.arrivals <= 3 * WORKERS * CAPACITY
    if in_order:  # each worker takes every other batch
        assert releaser.arrivals == 3 * WORKERS * CAPACITY


def test_slots_are_reused_once_batches_are_dropped(raw_shards: Reference) -> None:
    loader = _loader(raw_shards, persistent_workers=True)
    for _epoch in range(2):
        iterator = iter(loader)
        for index, batch in enumerate(iterator):
            _check(batch, raw_shards, [index])
        releaser = _releaser(iterator)
    # Every batch after each worker's first ones comes in a segment used before.
    assert releaser.arrivals == 3 * 2 * len(raw_shards.images)
    assert releaser.reuses >= releaser.arrivals - 3 * WORKERS * CAPACITY


def _view(batch: Any) -> Callable[[], Any]:
    view = batch[0][:, 1:]
    return lambda: view


def _array(batch: Any) -> Callable[[], Any]:
    array = batch[0].numpy()
    return lambda: array


def _storage(batch: Any) -> Callable[[], Any]:
    images = batch[0]
    storage, offset, shape = images.untyped_storage(), images.storage_offset(), images.shape
    return lambda: torch.empty(0, dtype=torch.uint8).set_(storage, offset, shape)


# What a caller may keep of a batch's image memory without keeping the batch.
HOLDS: dict[str, Callable[[Any], Callable[[], Any]]] = {
    "view": _view,
    "numpy": _array,
    "storage": _storage,
}


@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_memory_kept_from_an_earlier_batch_is_never_written_again(
    raw_shards: Reference, hold: str
) -> None:
    loader = _loader(raw_shards, persistent_workers=True)
    kept: list[tuple[int, Callable[[], Any]]] = []
    for _epoch in range(3):
        iterator = iter(loader)
        for index, batch in enumerate(iterator):
            if index % 5 == 0:
                kept.append((index, HOLDS[hold](batch)))
            del batch  # the rest is dropped: its segments go round the ring
        assert _releaser(iterator).reuses > 0
    for index, reach in kept:
        expected = raw_shards.images[[index]]
        got = np.asarray(reach())
        np.testing.assert_array_equal(got, expected[:, 1:] if hold == "view" else expected)


def test_an_iteration_left_mid_epoch_keeps_its_batches(raw_shards: Reference) -> None:
    for persistent in (False, True):
        loader = _loader(raw_shards, persistent_workers=persistent)
        iterator = iter(loader)
        early = [next(iterator) for _ in range(3)]  # kept; the workers' queued ones dropped
        del iterator
        gc.collect()
        for _epoch in range(2):
            for index, batch in enumerate(loader):
                _check(batch, raw_shards, [index])
        for index, batch in enumerate(early):
            _check(batch, raw_shards, [index])


def test_a_plain_dataloader_gets_fresh_memory_as_before(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"), layout="HWC")
    loader = DataLoader(dataset, batch_size=1, num_workers=WORKERS, collate_fn=passthrough_collate)
    batches = list(loader)
    for index, batch in enumerate(batches):
        _check(batch, raw_shards, [index])
        assert batch[0].untyped_storage().is_shared()
        assert _slots._trailer(batch[0].untyped_storage()) is None  # no ring segment


def test_the_loader_asks_for_a_ring_only_where_it_sees_the_batches(raw_shards: Reference) -> None:
    assert _loader(raw_shards)._worker_slot_count() == CAPACITY
    assert _loader(raw_shards, prefetch_factor=5)._worker_slot_count() == 7
    assert _loader(raw_shards, num_workers=0, prefetch_factor=None)._worker_slot_count() == 0
    pinned = _loader(raw_shards)
    pinned.pin_memory = True  # its batches are pinned copies: the worker's never show
    assert pinned._worker_slot_count() == 0


def test_resume_mid_epoch_is_exact_with_reused_slots(raw_shards: Reference) -> None:
    flat = raw_shards.images.reshape(len(raw_shards.images), -1)

    def indices_of(batch: Any) -> list[int]:
        images, labels, masks = batch
        found = []
        for row in range(len(images)):
            index = int(np.flatnonzero((flat == images[row].numpy().reshape(-1)).all(axis=1))[0])
            assert labels[row] == raw_shards.labels[index]
            np.testing.assert_array_equal(masks[row].numpy(), raw_shards.masks[index])
            found.append(index)
        return found

    def loader() -> ResumableDataLoader:
        dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"), layout="HWC")
        sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=3)
        return dataset.loader(batch_size=2, sampler=sampler, num_workers=WORKERS)

    first = loader()
    iterator = iter(first)
    seen = [index for _ in range(4) for index in indices_of(next(iterator))]
    state = first.state_dict()
    del iterator
    second = loader()
    second.load_state_dict(state)
    rest = [index for batch in second for index in indices_of(batch)]
    assert sorted(seen + rest) == list(range(len(flat)))


def test_a_worker_takes_back_only_segments_nothing_refers_to() -> None:
    slots = _slots.WorkerSlots()
    shape = (2, 3, 4)
    kept = slots.take(shape, torch.uint8, capacity=2)
    assert kept is not None and _slots._trailer(kept.untyped_storage()) is not None
    kept.fill_(7)
    slots.settle()  # still referenced (the batch being sent): stays held
    dropped = slots.take(shape, torch.uint8, capacity=2)
    assert dropped is not None and dropped.data_ptr() != kept.data_ptr()
    address = dropped.data_ptr()
    del dropped  # e.g. its samples were skipped: it never leaves the worker
    slots.settle()
    again = slots.take(shape, torch.uint8, capacity=2)
    assert again is not None and again.data_ptr() == address  # back in the ring
    assert slots.take(shape, torch.uint8, capacity=2) is None  # both held: the caller's turn
    assert torch.equal(kept, torch.full(shape, 7, dtype=torch.uint8))


def test_a_worker_never_takes_a_segment_it_still_refers_to() -> None:
    slots = _slots.WorkerSlots()
    shape = (4, 5)
    batch = slots.take(shape, torch.int64, capacity=1)
    slots.settle()
    slots._rings[(shape, torch.int64)][0].flag.value = _slots.FREE  # as the training process
    assert slots.take(shape, torch.int64, capacity=1) is None  # `batch` still refers to it
    del batch
    assert slots.take(shape, torch.int64, capacity=1) is not None


def test_a_batch_sent_on_to_another_process_is_never_written_again(
    raw_shards: Reference,
) -> None:
    """Pickled for another process (a ``torch.multiprocessing`` queue does this), a batch's
    memory has readers out of sight: its segment is never given back to the worker."""
    loader = _loader(raw_shards, persistent_workers=True)
    sent: list[tuple[int, bytes]] = []
    for _epoch in range(3):
        iterator = iter(loader)
        for index, batch in enumerate(iterator):
            if index % 7 == 3:
                sent.append((index, bytes(ForkingPickler.dumps(batch[0]))))
            del batch
        releaser = _releaser(iterator)
        assert releaser.reuses > 0 and releaser.passed_on > 0
    for index, message in sent:  # what the other process reads once it gets to it
        np.testing.assert_array_equal(pickle.loads(message).numpy(), raw_shards.images[[index]])


def test_a_batch_that_raises_in_the_worker_gives_its_segments_back(
    raw_shards: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segments a batch took before its dataset raised never leave the worker: they go
    back to the ring (once the exception is let go of), not held for good."""
    monkeypatch.setattr(_buffers, "get_worker_info", object)  # as in a worker
    monkeypatch.setattr(_base, "get_worker_info", object)
    dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"), layout="HWC")
    gather, failing = dataset.store.gather, {"mask"}

    def gather_or_fail(name: str, *args: Any, **kwargs: Any) -> Any:
        if name in failing:  # read after the image and label: mid-batch
            raise OSError(f"disk gone reading {name}")
        return gather(name, *args, **kwargs)

    monkeypatch.setattr(dataset.store, "gather", gather_or_fail)

    def read(start: int) -> Any:
        return dataset.__getitems__(EpochBatch([start, start + 1], epoch=0, worker_slots=1))

    with pytest.raises(OSError, match="disk gone reading mask"):
        read(0)  # each field's ring of one segment taken, then the read fails
    failing.clear()
    addresses = set()
    for start in (2, 4):
        batch = read(start)
        _check(batch, raw_shards, [start, start + 1])
        for value in batch:  # in the ring's one segment, not in fresh memory
            assert _slots._trailer(value.untyped_storage()) is not None
            addresses.add(value.data_ptr())
        del batch, value
        for ring in dataset._buffers._local.slots._rings.values():
            for slot in ring:
                slot.flag.value = _slots.FREE  # as the training process, done with the batch
    assert len(addresses) == 3  # one segment per field, used by each batch
