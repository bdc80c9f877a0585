"""DevicePrefetcher on the CPU device: the same one-ahead logic CUDA runs, without streams."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from fastdata.datasets import ResumableDataLoader, ShardAwareDistributedSampler
from fastdata.gpu import DevicePrefetcher, DeviceRandomResizedCrop, MaskToLong, Normalize, to_device

Pair = namedtuple("Pair", ["image", "label"])


class Numbers(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: a (2, 2, 3) uint8 image filled with i, and label i."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.epochs: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((2, 2, 3), index, dtype=torch.uint8), torch.tensor(index)

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class Tracked:
    """An iterable that records how many batches it produced and whether a pass was closed."""

    def __init__(self, batches: list[object]) -> None:
        self.batches = batches
        self.produced = 0
        self.closed = 0

    def __iter__(self) -> Iterator[object]:
        try:
            for batch in self.batches:
                self.produced += 1
                yield batch
        finally:
            self.closed += 1


def test_batch_structures_keep_shape_and_non_tensor_leaves() -> None:
    image, label = torch.zeros(2, 3, dtype=torch.uint8), torch.tensor([1, 2])
    blobs = [torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([4], dtype=torch.uint8)]
    batches: list[object] = [
        image,
        (image, label),
        [image, label, "name"],
        {"image": image, "nested": {"label": label, "ids": [7, 8]}, "jpeg": blobs},
        Pair(image, label),
    ]
    out = list(DevicePrefetcher(batches, "cpu"))
    assert torch.equal(out[0], image)
    assert isinstance(out[1], tuple)
    assert torch.equal(out[1][1], label)
    assert isinstance(out[2], list)
    assert out[2][2] == "name"
    assert out[3]["nested"]["ids"] == [7, 8]
    assert [b.tolist() for b in out[3]["jpeg"]] == [[1, 2, 3], [4]]
    assert isinstance(out[4], Pair)
    assert torch.equal(out[4].label, label)


def test_transform_mapping_applies_per_field() -> None:
    images = torch.full((2, 4, 4, 3), 100, dtype=torch.uint8)
    masks = torch.full((2, 4, 4), 255, dtype=torch.uint8)
    normalize = Normalize([100.0] * 3, [64.0] * 3)  # exact in float32
    transform = {"image": normalize, "mask": MaskToLong(ignore_value=255, ignore_index=-100)}
    (batch,) = list(to_device([{"image": images, "mask": masks, "id": 3}], "cpu", transform))
    assert batch["image"].shape == (2, 3, 4, 4)
    assert batch["image"].dtype == torch.float32
    assert batch["image"].abs().max().item() == 0.0
    assert batch["mask"].dtype == torch.int64
    assert batch["mask"].unique().tolist() == [-100]
    assert batch["id"] == 3
    ((image, label),) = list(to_device([(images, torch.tensor([1, 2]))], "cpu", {0: normalize}))
    assert image.dtype == torch.float32
    assert label.tolist() == [1, 2]


def test_callable_transform_gets_the_whole_batch() -> None:
    seen: list[object] = []

    def transform(batch: object) -> object:
        seen.append(batch)
        return "replaced"

    assert list(DevicePrefetcher([(torch.zeros(1),)], "cpu", transform=transform)) == ["replaced"]
    assert isinstance(seen[0], tuple)


def test_host_fields_stay_untouched() -> None:
    blobs = [torch.tensor([255, 216], dtype=torch.uint8)]
    batch = {"jpeg": blobs, "label": torch.tensor([0])}
    (out,) = list(DevicePrefetcher([batch], "cpu", host_fields=["jpeg"]))
    assert out["jpeg"] is blobs
    with pytest.raises(KeyError, match=r"host_fields names field\(s\) \['mask'\] that the batch"):
        list(DevicePrefetcher([batch], "cpu", host_fields=["mask"]))
    with pytest.raises(KeyError, match=r"transform names field\(s\) \[2\]"):
        list(DevicePrefetcher([(torch.zeros(1), torch.zeros(1))], "cpu", transform={2: abs}))


def test_one_batch_ahead_and_no_further() -> None:
    source = Tracked([torch.tensor([i]) for i in range(5)])
    iterator = iter(DevicePrefetcher(source, "cpu"))
    assert source.produced == 1
    for expected in range(5):
        batch = next(iterator)
        assert batch.item() == expected
        assert source.produced == min(expected + 2, 5)
    with pytest.raises(StopIteration):
        next(iterator)
    assert source.closed == 1


def test_early_break_closes_the_pass_and_reiteration_restarts() -> None:
    source = Tracked([torch.tensor([i]) for i in range(6)])
    prefetcher = DevicePrefetcher(source, "cpu")
    for batch in prefetcher:
        if batch.item() == 1:
            break
    del batch
    assert source.closed == 1
    first = iter(prefetcher)
    next(first)
    second = iter(prefetcher)  # starting a new pass closes the one still open
    assert source.closed == 2
    with pytest.raises(StopIteration):
        next(first)
    assert [b.item() for b in second] == list(range(6))
    assert source.closed == 3


def _failing_at(index: int) -> Iterator[torch.Tensor]:
    for i in range(4):
        if i == index:
            raise ValueError(f"cannot read batch {i}")
        yield torch.tensor([i])


def test_an_error_preparing_the_next_batch_surfaces_after_the_current_one() -> None:
    # The error belongs to batch 2: batches 0 and 1 are handed out first, none is lost.
    iterator = iter(DevicePrefetcher(_failing_at(2), "cpu"))
    assert next(iterator).item() == 0
    assert next(iterator).item() == 1
    with pytest.raises(ValueError, match="cannot read batch 2"):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)

    def transform(batch: torch.Tensor) -> torch.Tensor:
        if batch.item() == 1:
            raise RuntimeError("transform failed on batch 1")
        return batch

    got: list[int] = []
    with pytest.raises(RuntimeError, match="transform failed on batch 1"):
        for batch in DevicePrefetcher(
            [torch.tensor([i]) for i in range(3)], "cpu", transform=transform
        ):
            got.append(int(batch.item()))
    assert got == [0]


def test_len_and_attribute_passthrough() -> None:
    loader = DataLoader(Numbers(10), batch_size=4)
    prefetcher = DevicePrefetcher(loader, "cpu")
    assert len(prefetcher) == 3
    assert prefetcher.dataset is loader.dataset
    assert prefetcher.batch_size == 4
    with pytest.raises(AttributeError):
        _ = prefetcher._hidden
    with pytest.raises(TypeError, match="loader of type Tracked has no len"):
        len(DevicePrefetcher(Tracked([]), "cpu"))


def test_set_epoch_reaches_distributed_sampler_and_dataset() -> None:
    dataset = Numbers(16)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
    prefetcher = to_device(DataLoader(dataset, batch_size=4, sampler=sampler), "cpu")
    orders = []
    for epoch in range(2):
        prefetcher.set_epoch(epoch)
        orders.append([int(i) for _, labels in prefetcher for i in labels])
        sampler.set_epoch(epoch)
        assert orders[-1] == list(sampler)
    assert orders[0] != orders[1]
    assert len(orders[0]) == len(orders[1]) == 8
    assert dataset.epochs == [0, 1]


def test_set_epoch_reaches_the_seeded_device_augmentations() -> None:
    crop = DeviceRandomResizedCrop(2, layout="HWC", seed=4)
    loader = DataLoader(Numbers(8), batch_size=4)
    prefetcher = to_device(loader, "cpu", transform={0: nn.Sequential(crop)})
    prefetcher.set_epoch(3)
    reference = DeviceRandomResizedCrop(2, layout="HWC", seed=4)
    reference.set_epoch(3)
    assert torch.equal(crop.sample_boxes(4, 9, 9), reference.sample_boxes(4, 9, 9))


def test_dataloader_with_workers_early_break_then_full_pass() -> None:
    loader = DataLoader(Numbers(12), batch_size=3, num_workers=2)
    prefetcher = DevicePrefetcher(loader, "cpu", transform={0: Normalize([0.0] * 3, [1.0] * 3)})
    for images, _ in prefetcher:
        assert images.shape == (3, 3, 2, 2)
        break
    labels = [int(i) for _, batch_labels in prefetcher for i in batch_labels]
    assert labels == list(range(12))


def test_constructor_validation() -> None:
    with pytest.raises(TypeError, match="loader must be an iterable of batches, got int"):
        DevicePrefetcher(3, "cpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="transform must be a callable or a mapping"):
        DevicePrefetcher([], "cpu", transform=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"transform maps field\(s\) to non-callables"):
        DevicePrefetcher([], "cpu", transform={0: "x"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"device must be a str, int or torch\.device, got 1\.5"):
        DevicePrefetcher([], 1.5)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="device='cuda' needs CUDA, which is not available"):
        DevicePrefetcher([], "cuda")
    with pytest.raises(ValueError, match="device=0 needs CUDA"):
        to_device([], 0)


def test_trains_under_ddp_with_a_distributed_sampler(tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        dataset = Numbers(8)
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        model = DistributedDataParallel(nn.Linear(12, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler)
        normalize = Normalize([128.0] * 3, [64.0] * 3)
        seen = []
        for epoch in range(2):
            batches = to_device(loader, "cpu", transform={0: normalize})
            batches.set_epoch(epoch)
            for images, labels in batches:
                loss = (model(images.flatten(1)).squeeze(1) - labels.float()).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                seen.extend(labels.tolist())
        assert sorted(seen) == sorted(list(range(8)) * 2)
        assert seen[:8] != seen[8:]
    finally:
        dist.destroy_process_group()


def test_a_resumable_loaders_state_leaves_the_batch_in_flight_out() -> None:
    def loader() -> ResumableDataLoader:
        sampler = ShardAwareDistributedSampler([22], 1, 0, seed=4)
        return ResumableDataLoader(Numbers(22), batch_size=4, sampler=sampler)

    order = ShardAwareDistributedSampler([22], 1, 0, seed=4).rank_indices().tolist()
    first = loader()
    batches = iter(DevicePrefetcher(first, "cpu"))
    head = [i for _ in range(2) for i in next(batches)[1].tolist()]
    state = first.state_dict()
    assert state["sampler"]["num_consumed"] == 8  # the third batch is in flight, not used
    del batches  # an early break drops the batch in flight: still not consumed
    assert first.state_dict() == state

    resumed = loader()
    resumed.load_state_dict(state)
    tail = [i for _, labels in DevicePrefetcher(resumed, "cpu") for i in labels.tolist()]
    assert head + tail == order
