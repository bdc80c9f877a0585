"""The CUDA paths: streams, pinned memory, memory reuse, flat memory, early break.

Every test here is `gpu`-marked: skipped without CUDA, run with ``make test-gpu`` on a
machine that has one.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from fastdata.gpu import (
    DevicePrefetcher,
    DeviceRandomHorizontalFlip,
    DeviceRandomResizedCrop,
    MaskToLong,
    Normalize,
    to_device,
)
from fastdata.gpu.prefetch import MAX_STEPS_AHEAD
from tests.gpu.cuda_checks import host_syncs, spin

pytestmark = pytest.mark.gpu

MEAN, STD = [120.0, 110.0, 100.0], [60.0, 55.0, 50.0]
# ~1 ms of GPU spin per call on a recent GPU: long enough to expose any missing wait.
SPIN_CYCLES = 2_000_000


def _batches(count: int, size: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batch i: (8, size, size, 3) uint8 filled with i, labels all i (host, not pinned)."""
    return [
        (torch.full((8, size, size, 3), i, dtype=torch.uint8), torch.full((8,), i))
        for i in range(count)
    ]


def _settled_allocated() -> int:
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def test_normalize_on_cuda_matches_cpu() -> None:
    images = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        normalize = Normalize(MEAN, STD, dtype=dtype, channels_last=True)
        expected = normalize(images)
        out = normalize.to("cuda")(images.cuda())
        assert out.device.type == "cuda"
        assert out.dtype == dtype
        assert out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out.cpu(), expected, atol=2e-2, rtol=1e-2)


def test_normalize_under_cuda_autocast_and_compile() -> None:
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, device="cuda")
    normalize = Normalize(MEAN, STD, dtype=torch.float16).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = normalize(images)
    assert out.dtype == torch.float16
    compiled = torch.compile(normalize, fullgraph=True)
    torch.testing.assert_close(compiled(images), normalize(images))


def test_mask_to_long_on_cuda() -> None:
    masks = torch.tensor([[[1, 255]]], dtype=torch.uint8, device="cuda")
    out = MaskToLong(ignore_value=255, ignore_index=-100)(masks)
    assert out.device.type == "cuda"
    assert out.tolist() == [[[1, -100]]]


def test_prefetcher_copies_to_cuda_through_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned_sources: list[bool] = []
    original_to = torch.Tensor.to

    def spy_to(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if self.device.type == "cpu" and kwargs.get("non_blocking"):
            pinned_sources.append(self.is_pinned())
        return original_to(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(torch.Tensor, "to", spy_to)
    out = list(DevicePrefetcher(_batches(3), "cuda"))
    monkeypatch.undo()
    assert pinned_sources == [True] * 6
    for i, (images, labels) in enumerate(out):
        assert images.device.type == "cuda"
        assert labels.device.type == "cuda"
        assert int(images.float().mean().item()) == i


def test_consumer_waits_for_the_side_streams_work() -> None:
    # The transform spins on the side stream before it writes the batch, and the consumer
    # reads at once: it sees the right values only if it waits for the batch's event.
    batches = _batches(12, size=256)
    normalize = Normalize([0.0] * 3, [1.0] * 3).cuda()

    def slow_normalize(images: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(10 * SPIN_CYCLES)  # queued on the side stream
        return normalize(images)

    sums = []
    for images, labels in to_device(batches, "cuda", transform={0: slow_normalize}):
        sums.append(torch.stack([images.mean(), labels.float().mean()]))  # read at once
    values = torch.stack(sums).cpu()
    expected = torch.arange(12, dtype=torch.float32)
    torch.testing.assert_close(values[:, 0], expected)
    torch.testing.assert_close(values[:, 1], expected)


def test_handed_out_memory_is_not_reused_while_the_consumer_reads_it() -> None:
    # The consumer queues slow reads of each batch and drops it at once. The side stream
    # allocates batch i + 2 while the reads of batch i are still queued: only
    # record_stream keeps the allocator from handing it batch i's memory.
    pointers, sums = [], []
    for images, labels in DevicePrefetcher(_batches(10, size=256), "cuda"):
        torch.cuda._sleep(20 * SPIN_CYCLES)  # ~20 ms: far longer than a host step
        sums.append(images.float().mean())
        pointers.append(images.data_ptr())
        del images, labels
    torch.cuda.synchronize()
    assert [round(s.item()) for s in sums] == list(range(10))
    for i in range(len(pointers) - 2):
        assert pointers[i + 2] != pointers[i], f"batch {i + 2} reused batch {i}'s memory"


def test_consumer_on_its_own_stream() -> None:
    # The transform spins on the side stream before it writes the batch, and the consumer,
    # on a stream of its own, reads at once: right values only if that stream waits.
    normalize = Normalize([0.0] * 3, [1.0] * 3).cuda()

    def slow_normalize(images: torch.Tensor) -> torch.Tensor:
        spin(10 * SPIN_CYCLES)  # queued on the side stream, before the batch is written
        return normalize(images)

    consumer = torch.cuda.Stream()
    means = []
    with torch.cuda.stream(consumer):
        prefetcher = DevicePrefetcher(_batches(6, size=128), "cuda", transform={0: slow_normalize})
        for images, _ in prefetcher:
            means.append(images.mean())  # read at once, on the consumer's stream
    consumer.synchronize()
    assert [round(m.item()) for m in means] == list(range(6))


def test_memory_is_flat_across_epochs() -> None:
    normalize = Normalize(MEAN, STD).cuda()
    normalize(_batches(1, size=8)[0][0].cuda())  # its first call keeps its constants there
    prefetcher = DevicePrefetcher(_batches(10, size=128), "cuda", transform={0: normalize})
    baseline = _settled_allocated()
    after_epoch, peaks, reserved = [], [], []
    for _epoch in range(3):
        torch.cuda.reset_peak_memory_stats()
        for images, labels in prefetcher:
            (images.sum() + labels.sum()).item()
        del images, labels
        after_epoch.append(_settled_allocated())
        peaks.append(torch.cuda.max_memory_allocated())
        reserved.append(torch.cuda.memory_reserved())
    assert after_epoch == [baseline] * 3
    assert max(peaks[1:]) <= peaks[0]
    assert reserved[2] == reserved[1]


def _segment_bytes(nbytes: int) -> int:
    """What the caching allocator reserves for one allocation over 10 MiB (2 MiB steps)."""
    step = 2 * 2**20
    return -(-nbytes // step) * step


def test_host_run_ahead_and_memory_are_bounded() -> None:
    # The consumer queues slow work and never synchronizes: without the bound the host would
    # race through all 24 batches, each one's memory held back by record_stream. The
    # allocator counts such memory as free in memory_allocated() the moment it is freed,
    # so the bound shows in the memory it reserves: batches over 10 MiB get a segment each.
    batches = _batches(24, size=700)
    batch_bytes = batches[0][0].numel()
    assert batch_bytes > 10 * 2**20
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    for images, _labels in DevicePrefetcher(batches, "cuda"):
        torch.cuda._sleep(5 * SPIN_CYCLES)
        images.add_(1)
    del images, _labels
    torch.cuda.synchronize()
    grown = torch.cuda.max_memory_reserved() - baseline
    small_pool = 2 * 2**20  # the labels
    assert grown <= (MAX_STEPS_AHEAD + 3) * _segment_bytes(batch_bytes) + small_pool


def test_early_break_and_reiteration_leak_nothing() -> None:
    prefetcher = DevicePrefetcher(_batches(8, size=128), "cuda")
    baseline = _settled_allocated()
    for _pass in range(3):
        for images, _labels in prefetcher:
            images.float().mean().item()
            break
        del images, _labels
    assert _settled_allocated() == baseline
    first = iter(prefetcher)
    next(first)
    second = iter(prefetcher)  # closes the first pass, dropping its in-flight batch
    assert sum(1 for _ in second) == 8
    del first, second
    assert _settled_allocated() == baseline


def test_device_index_and_int_device() -> None:
    # cuda:1 where two GPUs exist (not the current device): the batches must land there
    last = torch.cuda.device_count() - 1
    target = torch.device("cuda", last)
    current = torch.device("cuda", torch.cuda.current_device())
    for device, expected in (("cuda", current), (last, target), (f"cuda:{last}", target)):
        normalize = Normalize(MEAN, STD).to(expected)
        prefetcher = DevicePrefetcher(_batches(2), device, transform={0: normalize})
        assert prefetcher.device == expected
        for images, labels in prefetcher:
            assert images.device == expected and labels.device == expected
            assert images.dtype == torch.float32


def test_host_fields_stay_on_the_host_under_cuda() -> None:
    blobs = [torch.tensor([255, 216, 255], dtype=torch.uint8)]
    batches = [{"jpeg": blobs, "label": torch.tensor([1])}]
    (batch,) = list(DevicePrefetcher(batches, "cuda", host_fields=["jpeg"]))
    assert batch["jpeg"] is blobs
    assert batch["label"].device.type == "cuda"


def test_augmentation_on_cuda_matches_cpu_with_the_same_seed() -> None:
    images = torch.randint(0, 256, (16, 3, 40, 48), dtype=torch.uint8)
    masks = images[:, 0] // 32
    cpu_out = DeviceRandomHorizontalFlip(seed=4)(images, masks)
    cuda_out = DeviceRandomHorizontalFlip(seed=4)(images.cuda(), masks.cuda())
    for cpu_t, cuda_t in zip(cpu_out, cuda_out, strict=True):
        assert torch.equal(cpu_t, cuda_t.cpu())
    as_float = images.float()
    cpu_crop = DeviceRandomResizedCrop(24, seed=4)(as_float)
    cuda_crop = DeviceRandomResizedCrop(24, seed=4)(as_float.cuda())
    torch.testing.assert_close(cuda_crop.cpu(), cpu_crop, atol=5e-2, rtol=1e-4)  # same boxes
    half = DeviceRandomResizedCrop(24, seed=4)(as_float.cuda().half())
    assert half.dtype == torch.float16


def _endless(
    batch: tuple[torch.Tensor, torch.Tensor],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield batch


def test_endless_loader_with_early_break_releases_its_batch() -> None:
    baseline = _settled_allocated()
    prefetcher = DevicePrefetcher(_endless(_batches(1, size=128)[0]), "cuda")
    for step, (images, _labels) in enumerate(prefetcher):
        images.sum().item()
        if step == 5:
            break
    del images, _labels, prefetcher
    assert _settled_allocated() == baseline


def test_steady_state_prefetching_makes_no_host_sync() -> None:
    batches = [(b[0].pin_memory(), b[1].pin_memory()) for b in _batches(12, size=128)]
    prefetcher = DevicePrefetcher(batches, "cuda", transform={0: Normalize(MEAN, STD).cuda()})
    list(prefetcher)  # warm-up: allocator, kernels
    steps = iter(prefetcher)
    assert host_syncs(lambda: [next(steps) for _ in range(8)]) == 0
    list(steps)


def test_normalize_and_augmentation_make_no_host_sync() -> None:
    normalize = Normalize(MEAN, STD, dtype=torch.bfloat16, channels_last=True).cuda()
    flip, crop = DeviceRandomHorizontalFlip(seed=1), DeviceRandomResizedCrop(64, seed=1)
    images = torch.randint(0, 256, (8, 3, 96, 96), dtype=torch.uint8, device="cuda")

    def step() -> None:
        normalize(crop(flip(images)))
        repr(normalize)  # printing a model reads no buffer back

    step()
    assert host_syncs(step) == 0
