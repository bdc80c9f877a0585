from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from fastdata.decode import _batching as batching
from fastdata.decode._batching import (
    MAX_INTERPOLATION_SHRINK,
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


@pytest.fixture
def interpolate_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    calls: list[dict[str, object]] = []
    real = batching.F.interpolate

    def spy(input: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append({"in": tuple(input.shape[-2:]), "n": input.shape[0], **kwargs})
        return real(input, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(batching.F, "interpolate", spy)
    return calls


@pytest.mark.parametrize(("box", "out_hw"), [(Box(0, 0, 2000, 30), (10, 60)),   # y 200x, x grows
                                             (Box(0, 0, 1500, 1900), (7, 9)),   # ~210x both
                                             (Box(0, 0, 40, 300), (80, 20))])  # fmt: skip
def test_interpolation_is_always_antialiased_and_never_shrinks_too_far(
    interpolate_calls: list[dict[str, object]], box: Box, out_hw: tuple[int, int]
) -> None:
    # CUDA's antialiased kernel fails beyond ~94x per axis; an axis that shrinks must be
    # antialiased even when the other grows.
    rng = np.random.default_rng(0)
    image = torch.from_numpy(rng.integers(0, 256, (3, box.height, box.width), dtype=np.uint8))
    got = crop_resize_chw(image, box, out_hw)
    assert got.shape == (3, *out_hw)
    assert interpolate_calls and all(call["antialias"] is True for call in interpolate_calls)
    for call in interpolate_calls:
        in_h, in_w = call["in"]  # type: ignore[misc]
        assert in_h <= MAX_INTERPOLATION_SHRINK * out_hw[0]
        assert in_w <= MAX_INTERPOLATION_SHRINK * out_hw[1]


def test_pre_reduction_matches_one_antialiased_pass() -> None:
    # On the CPU one antialiased pass works at any factor: the area pre-reduction that CUDA
    # needs beyond ~94x must give nearly the same pixels.
    rgb = torch.from_numpy(smooth_rgb(1600, 1200, seed=3)).permute(2, 0, 1)
    for out_hw in ((8, 6), (16, 12), (100, 75)):
        got = crop_resize_chw(rgb, Box(0, 0, 1600, 1200), out_hw).float()
        one_pass = torch.nn.functional.interpolate(
            rgb[None].float(), size=out_hw, mode="bilinear", antialias=True
        )[0].round()
        assert (got - one_pass).abs().mean() <= 1.0


def test_batch_resize_runs_once_per_region_size(
    interpolate_calls: list[dict[str, object]],
) -> None:
    rgb = torch.from_numpy(smooth_rgb(120, 160, seed=2)).permute(2, 0, 1)
    boxes = [Box(0, 0, 100, 100), Box(10, 20, 100, 100), Box(5, 5, 60, 90), Box(1, 2, 100, 100)]
    out = torch.empty((4, 3, 32, 32), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last
    )
    crop_resize_batch([rgb] * 4, boxes, out)
    assert sorted(call["n"] for call in interpolate_calls) == [1, 3]  # type: ignore[type-var]
    for row, box in enumerate(boxes):
        assert torch.equal(out[row], crop_resize_chw(rgb, box, (32, 32)))


def test_batch_resize_indexes_rows_with_one_device_tensor(
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
    assert uploads == [([0, 2, 1, 3], out.device)]  # the rows of each size, in one upload
    for row, box in enumerate(boxes):
        assert torch.equal(out[row], crop_resize_chw(rgb, box, (32, 32)))


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
