from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from fastdata.decode._batching import crop_resize_chw, decode_batch_or_each
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
