from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from fastdata.decode import _batching as batching
from fastdata.decode._batching import (
    crop_resize_batch,
    crop_resize_chw,
    decode_batch_or_each,
    is_environment_error,
)
from fastdata.decode._geometry import Box
from tests.decode.conftest import smooth_rgb


def _strict_double(items: list[int]) -> list[int]:
    if any(item < 0 for item in items):
        raise RuntimeError("bad item in batch")
    return [2 * item for item in items]


def _double_one(item: int) -> int:
    return _strict_double([item])[0]


def test_batch_succeeds_in_one_call() -> None:
    calls: list[int] = []

    def one(item: int) -> int:
        calls.append(item)
        return _double_one(item)

    assert decode_batch_or_each([1, 2, 3], _strict_double, one) == [2, 4, 6]
    assert calls == []
    assert decode_batch_or_each([], _strict_double, one) == []


def test_failed_batch_is_retried_one_by_one() -> None:
    results = decode_batch_or_each([1, -1, 3], _strict_double, _double_one)
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], RuntimeError)


def test_wrong_result_count_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="returned 1 for 2 inputs"):
        decode_batch_or_each([1, 2], lambda items: [0], _double_one)


@pytest.mark.parametrize(("box", "out_hw"), [(Box(10, 20, 200, 240), (50, 60)),
                                             (Box(0, 0, 40, 30), (80, 60))])  # fmt: skip
def test_torch_crop_resize_matches_opencv(box: Box, out_hw: tuple[int, int]) -> None:
    rgb = smooth_rgb(240, 320, seed=5)
    got = crop_resize_chw(torch.from_numpy(rgb).permute(2, 0, 1), box, out_hw)
    assert got.shape == (3, *out_hw) and got.dtype == torch.uint8
    region = rgb[box.top : box.top + box.height, box.left : box.left + box.width]
    shrinking = box.height >= out_hw[0]
    mode = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    want = cv2.resize(region, (out_hw[1], out_hw[0]), interpolation=mode)
    diff = np.abs(got.permute(1, 2, 0).numpy().astype(np.int16) - want)
    assert diff.mean() <= 1.5


def test_torch_crop_without_resize_is_exact() -> None:
    image = torch.arange(3 * 8 * 8, dtype=torch.uint8).reshape(3, 8, 8)
    assert torch.equal(crop_resize_chw(image, Box(2, 1, 4, 5), (4, 5)), image[:, 2:6, 1:6])


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support"),
        TypeError("decode_jpeg() expected a Tensor, got list"),
    ],
)
def test_environment_errors_raise_instead_of_per_image_failures(error: Exception) -> None:
    retried: list[int] = []

    def many(items: list[int]) -> list[int]:
        raise error

    def one(item: int) -> int:
        retried.append(item)
        return item

    with pytest.raises(type(error)):
        decode_batch_or_each([1, 2], many, one)
    assert retried == []

    # ... and from a lone retry after a batch that failed on a bad image
    def one_fails(item: int) -> int:
        raise error

    with pytest.raises(type(error)):
        decode_batch_or_each([1, -1], _strict_double, one_fails)


def test_batch_failure_callback_sees_the_decode_error() -> None:
    seen: list[Exception] = []
    decode_batch_or_each([1, -1], _strict_double, _double_one, on_batch_failure=seen.append)
    assert [str(e) for e in seen] == ["bad item in batch"]
    assert not is_environment_error(seen[0])


def _exact_axis_weights(size: int, out_size: int) -> np.ndarray:
    """``(out_size, size)`` float64 reference weights, one output pixel at a time: the exact
    area average of its span when shrinking, else bilinear with half-pixel centres."""
    weights = np.zeros((out_size, size))
    scale = size / out_size
    for target in range(out_size):
        if scale > 1:
            lo, hi = target * scale, (target + 1) * scale
            for source in range(int(lo), min(int(np.ceil(hi)), size)):
                weights[target, source] = min(source + 1, hi) - max(source, lo)
        else:
            centre = min(max((target + 0.5) * scale - 0.5, 0.0), size - 1)
            below = int(centre)
            weights[target, below] += 1 - (centre - below)
            weights[target, min(below + 1, size - 1)] += centre - below
    return weights / weights.sum(axis=1, keepdims=True)


def _reference(image: torch.Tensor, box: Box, out_hw: tuple[int, int]) -> np.ndarray:
    """``(C, *out_hw)`` float64, unrounded: each region resized alone in NumPy."""
    region = image[:, box.top : box.top + box.height, box.left : box.left + box.width]
    rows = _exact_axis_weights(box.height, out_hw[0])
    cols = _exact_axis_weights(box.width, out_hw[1])
    return np.einsum("ij,cjk,lk->cil", rows, region.numpy().astype(np.float64), cols)


def _assert_rounds_the_reference(got: torch.Tensor, want: np.ndarray) -> None:
    # float32 against float64: the rounded result is within half a level (and a hair)
    assert np.abs(got.numpy().astype(np.float64) - want).max() <= 0.5 + 1e-3


@pytest.mark.parametrize(("box", "out_hw"), [(Box(0, 0, 2000, 30), (10, 60)),   # y 200x, x grows
                                             (Box(3, 5, 1500, 1900), (7, 9)),   # ~210x both
                                             (Box(2, 1, 40, 300), (80, 20)),    # y grows, x 15x
                                             (Box(1, 2, 37, 53), (16, 24))])  # fmt: skip
def test_resize_is_an_exact_area_average_or_bilinear_at_any_factor(
    box: Box, out_hw: tuple[int, int]
) -> None:
    rng = np.random.default_rng(0)
    shape = (3, box.top + box.height + 4, box.left + box.width + 4)
    image = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8))
    got = crop_resize_chw(image, box, out_hw)
    assert got.shape == (3, *out_hw) and got.dtype == torch.uint8
    _assert_rounds_the_reference(got, _reference(image, box, out_hw))


def test_enlarging_is_torch_bilinear() -> None:
    image = torch.from_numpy(smooth_rgb(30, 40, seed=4)).permute(2, 0, 1)
    got = crop_resize_chw(image, Box(5, 6, 20, 25), (48, 61)).float()
    want = torch.nn.functional.interpolate(
        image[None, :, 5:25, 6:31].float(), size=(48, 61), mode="bilinear", align_corners=False
    )[0]
    assert (got - want).abs().max() <= 0.5 + 1e-3


@pytest.fixture
def matmul_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shape of the left operand of every ``torch.bmm`` call."""
    calls: list[tuple[int, ...]] = []
    real = torch.bmm

    def spy(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(left.shape))
        return real(left, right)

    monkeypatch.setattr(torch, "bmm", spy)
    return calls


@pytest.mark.parametrize("out_hw", [(32, 32), (12, 40), (40, 12)])
@pytest.mark.parametrize("channels", [3, 1])
def test_batch_resize_is_two_matmuls_whatever_the_sizes(
    matmul_calls: list[tuple[int, ...]], out_hw: tuple[int, int], channels: int
) -> None:
    # one launch set for the batch, not one per distinct region size; each row as resized alone
    rgb = torch.from_numpy(smooth_rgb(120, 160, seed=2)).permute(2, 0, 1)[:channels]
    boxes = [Box(0, 0, 100, 100), Box(10, 20, 100, 90), Box(5, 5, 60, 90), Box(1, 2, 20, 13),
             Box(0, 0, 120, 160), Box(7, 3, 32, 32)]  # fmt: skip
    out = torch.empty((len(boxes), channels, *out_hw), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last
    )
    crop_resize_batch([rgb] * len(boxes), boxes, out)
    assert len(matmul_calls) == 2 and matmul_calls[0][0] == len(boxes)
    for row, box in enumerate(boxes):
        _assert_rounds_the_reference(out[row], _reference(rgb, box, out_hw))


def test_batch_resize_takes_oriented_and_mixed_size_images() -> None:
    # EXIF-turned regions arrive as transposed or flipped views of images of other sizes
    base = torch.from_numpy(smooth_rgb(90, 70, seed=6)).permute(2, 0, 1)
    images = [base, base.transpose(-2, -1), base.flip(-1), base[:, 10:50, 5:65]]
    boxes = [Box(3, 4, 80, 60), Box(0, 0, 70, 90), Box(10, 0, 50, 70), Box(0, 0, 40, 60)]
    out = torch.empty((4, 3, 24, 24), dtype=torch.uint8)
    crop_resize_batch(images, boxes, out)
    for row, (image, box) in enumerate(zip(images, boxes, strict=True)):
        _assert_rounds_the_reference(out[row], _reference(image, box, (24, 24)))


def test_large_batches_go_in_chunks_with_the_same_pixels(
    matmul_calls: list[tuple[int, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    rgb = torch.from_numpy(smooth_rgb(120, 160, seed=2)).permute(2, 0, 1)
    boxes = [Box(0, 0, 100, 100), Box(10, 20, 100, 90), Box(5, 5, 60, 90), Box(1, 2, 20, 13)]
    whole = torch.empty((4, 3, 16, 16), dtype=torch.uint8)
    crop_resize_batch([rgb] * 4, boxes, whole)
    assert len(matmul_calls) == 2
    # room for two 100x100 RGB regions: rows 0-1, then 2-3
    monkeypatch.setattr(batching, "MAX_PADDED_ELEMENTS", 2 * 3 * 100 * 100)
    chunked = torch.empty_like(whole)
    crop_resize_batch([rgb] * 4, boxes, chunked)
    assert [call[0] for call in matmul_calls[2:]] == [2, 2, 2, 2]
    assert torch.equal(chunked, whole)


def test_batch_resize_uploads_the_sizes_once(
    list_indices: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uploads: list[tuple[list[int], torch.device]] = []
    real_copy = batching.copy_to_device

    def spy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        uploads.append((host.tolist(), device))
        return real_copy(host, device)

    monkeypatch.setattr(batching, "copy_to_device", spy)
    rgb = torch.from_numpy(smooth_rgb(120, 160, seed=2)).permute(2, 0, 1)
    boxes = [Box(0, 0, 100, 100), Box(5, 5, 60, 90), Box(1, 2, 100, 100), Box(3, 3, 50, 70)]
    out = torch.empty((4, 3, 32, 32), dtype=torch.uint8)
    crop_resize_batch([rgb] * 4, boxes, out)
    assert list_indices == []
    assert uploads == [([[100, 100], [60, 90], [100, 100], [50, 70]], out.device)]


def test_regions_of_the_output_size_are_copied_exactly() -> None:
    image = torch.arange(3 * 9 * 9, dtype=torch.uint8).reshape(3, 9, 9)
    out = torch.empty((2, 3, 4, 5), dtype=torch.uint8)
    crop_resize_batch([image, image], [Box(2, 1, 4, 5), Box(0, 3, 4, 5)], out)
    assert torch.equal(out[0], image[:, 2:6, 1:6]) and torch.equal(out[1], image[:, 0:4, 3:8])
    mixed = torch.empty((2, 3, 4, 5), dtype=torch.uint8)  # the identity inside the matmuls
    crop_resize_batch([image, image], [Box(2, 1, 4, 5), Box(0, 0, 9, 9)], mixed)
    assert torch.equal(mixed[0], image[:, 2:6, 1:6])


def test_batch_resize_rejects_mismatched_lengths() -> None:
    image = torch.zeros((3, 8, 8), dtype=torch.uint8)
    with pytest.raises(ValueError, match="got 1 images, 2 boxes and 1 output rows"):
        crop_resize_batch([image], [Box(0, 0, 4, 4)] * 2, torch.empty((1, 3, 2, 2)))


def test_copy_to_device_pins_and_copies_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []
    pinned: set[int] = set()

    def pin_memory(self: torch.Tensor) -> torch.Tensor:
        calls.append(("pin", self.is_pinned()))
        copy = self.clone()
        pinned.add(id(copy))
        return copy

    def to(self: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        calls.append(("to", (str(device), non_blocking, id(self) in pinned)))
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: id(self) in pinned)
    cuda = torch.device("cuda", 0)
    batching.copy_to_device(torch.zeros(3), cuda)
    assert calls == [("pin", False), ("to", ("cuda:0", True, True))]
    calls.clear()
    already = pin_memory(torch.zeros(3))
    calls.clear()
    batching.copy_to_device(already, cuda)
    assert calls == [("to", ("cuda:0", True, True))]  # pinned already: not pinned again
    host = torch.zeros(3)
    assert batching.copy_to_device(host, torch.device("cpu")) is host


# torchvision's messages (decode_jpegs_cuda.cpp): statuses and CUDA errors as numbers.
_TV = "Error while decoding JPEG images: "


@pytest.mark.parametrize(
    "message",
    [
        _TV + "Failed to decode batch: 5",  # allocator failure: the GPU is full
        _TV + "Failed to decode batch: 6",  # execution failed
        _TV + "Failed to decode batch: 8",  # internal error
        _TV + "Failed to decode jpeg stream: 1",  # not initialized
        _TV + "Failed to synchronize CUDA stream: 700",  # illegal address
        "Failed to initialize nvjpeg with hardware backend: 8",
        "Failed to initialize nvjpeg with default backend: 2",
        "Failed to create pinned buffer: 5",
        "nvjpegGetProperty failed: 3",
        _TV + "Failed to decode batch: 5\nException raised from decode_images at x.cpp:421",
    ],
)
def test_torchvision_status_numbers_of_the_environment_raise(message: str) -> None:
    assert is_environment_error(RuntimeError(message))


@pytest.mark.parametrize(
    "message",
    [
        _TV + "Failed to get image info: 3",  # bad JPEG
        _TV + "Failed to decode batch: 3",
        _TV + "Failed to decode batch: 4",  # JPEG not supported
        _TV + "Failed to parse jpeg stream: 10",  # incomplete bitstream
        _TV + "Failed to decode jpeg stream: 9",  # implementation not supported
        _TV + "Unknown chroma subsampling",
        "Critical error in pipeline: image 3 of 128: 5",  # no torchvision step: not a status
    ],
)
def test_torchvision_status_numbers_of_the_image_are_decode_errors(message: str) -> None:
    assert not is_environment_error(RuntimeError(message))
