"""Crop-in-decode: a dataset over encoded images whose transform starts with a random
resized crop decodes each image straight into its crop box, with the boxes the CPU
transform draws after a full decode (the same seed, the same crop)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from fastdata import RAMDataset, ops
from fastdata._codec import reduction_factors
from fastdata.errors import DecodeError
from fastdata.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop
from tests.datasets.conftest import decoded_two_ways, write_jpegs

COUNT = 12
# Mean absolute difference (levels of 255) allowed between a box decoded at a reduced
# DCT scale and resampled, and the same box cut from the full decode and resized.
MEAN_TOLERANCE = 4.0


@pytest.fixture
def jpeg_files(tmp_path: Path) -> list[Path]:
    return write_jpegs(tmp_path, COUNT, 192, 256)


@pytest.fixture
def recorded_boxes(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Every box ``ops.RandomResizedCrop.boxes`` returns, in order."""
    boxes: list[list[int]] = []
    original = ops.RandomResizedCrop.boxes

    def record(self: ops.RandomResizedCrop, *args: Any) -> np.ndarray:
        result = original(self, *args)
        boxes.extend(result.tolist())
        return result

    monkeypatch.setattr(ops.RandomResizedCrop, "boxes", record)
    return boxes


@pytest.mark.parametrize("size", [32, 128])  # 32: mostly reduced decodes; 128: full scale
def test_the_same_seed_gives_the_same_boxes_and_close_pixels(
    jpeg_files: list[Path], recorded_boxes: list[list[int]], size: int
) -> None:
    indices = list(range(COUNT))
    in_decode, after = _decoded_two_ways(
        jpeg_files, lambda: RandomResizedCrop(size, seed=5), num_threads=1
    )
    got = in_decode.__getitems__(indices)[0].permute(0, 2, 3, 1).numpy()
    boxes_in_decode = list(recorded_boxes)
    recorded_boxes.clear()
    expected = after.__getitems__(indices)[0].permute(0, 2, 3, 1).numpy()
    assert boxes_in_decode == recorded_boxes  # one box per image, the same boxes
    sides = np.array(boxes_in_decode)[:, 2:4]
    factors = reduction_factors(sides, (size, size))
    assert (factors > 1).any() if size == 32 else (factors == 1).all()
    for k in range(COUNT):
        difference = np.abs(got[k].astype(np.int16) - expected[k])
        if factors[k] == 1:
            np.testing.assert_array_equal(got[k], expected[k])  # the same kernel, same pixels
        else:
            assert difference.mean() <= MEAN_TOLERANCE, (k, difference.mean())


def test_keyed_draws_through_the_loader_and_the_rest_of_the_transform(
    jpeg_files: list[Path],
) -> None:
    def train() -> Compose:
        return Compose([RandomResizedCrop(128, seed=3), RandomHorizontalFlip(seed=4)])

    in_decode, after = _decoded_two_ways(jpeg_files, train)
    assert isinstance(in_decode.plan.after_decode, RandomHorizontalFlip)

    def epochs(dataset: RAMDataset, **settings: Any) -> list[np.ndarray]:
        loader = dataset.loader(batch_size=5, **settings)
        return [np.concatenate([b[0].numpy() for b in loader]) for _ in range(2)]

    got, expected = epochs(in_decode, num_workers=2), epochs(after)
    assert not np.array_equal(got[0], got[1])
    for epoch in range(2):  # boxes under 2x the output: full scale, the same pixels
        np.testing.assert_array_equal(got[epoch], expected[epoch])


def test_png_files_are_decoded_whole_then_cropped(tmp_path: Path) -> None:
    paths = []
    for i in range(4):
        path = tmp_path / f"{i}.png"
        image = np.random.default_rng(i).integers(0, 256, (120, 90, 3), dtype=np.uint8)
        path.write_bytes(cv2.imencode(".png", image)[1].tobytes())
        paths.append(path)
    in_decode, after = _decoded_two_ways(paths, lambda: RandomResizedCrop(40, seed=1))
    got = in_decode.__getitems__([0, 1, 2, 3])[0].numpy()
    np.testing.assert_array_equal(got, after.__getitems__([0, 1, 2, 3])[0].numpy())


def test_bad_bytes_follow_on_error(jpeg_files: list[Path]) -> None:
    jpeg_files[2].write_bytes(b"\xff\xd8 not a jpeg")
    skipping = RAMDataset(
        jpeg_files, list(range(COUNT)), RandomResizedCrop(32), on_error="skip", show_progress=False
    )
    assert skipping.__getitems__([1, 2, 3])[1].tolist() == [1, 3]
    raising = RAMDataset(jpeg_files, list(range(COUNT)), RandomResizedCrop(32), show_progress=False)
    with pytest.raises(DecodeError, match=r"dataset\[2\]"):
        raising.__getitems__([1, 2, 3])


def test_only_a_leading_default_kernel_crop_without_masks_or_min_side_is_handed_over(
    jpeg_files: list[Path],
) -> None:
    def plan(transform: Any, **kwargs: Any) -> Any:
        dataset = RAMDataset(jpeg_files, None, transform, show_progress=False, **kwargs)
        return dataset.plan.decode_crop

    assert plan(RandomResizedCrop(32)) is not None
    assert plan(Compose([RandomHorizontalFlip(), RandomResizedCrop(32)])) is None
    assert plan(RandomResizedCrop(32, interpolation=cv2.INTER_LINEAR)) is None
    assert plan(RandomResizedCrop(32), decode_min_side=64) is None


class _EpochIndices(list[int]):
    """Batch indices that carry their epoch, as the batches of ``dataset.loader()`` do."""

    epoch = 1


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batch_planned_at_once_keeps_each_rows_crop_when_samples_are_skipped(
    jpeg_files: list[Path], threads: int
) -> None:
    """The boxes of a whole batch are drawn in one call and each crop is decoded into its
    row of one batch: a skipped sample and a PNG among the JPEGs leave every other row the
    crop of its own image, as cropping after a full decode gives it (draws keyed by
    ``(seed, epoch, index)``, as a dataset's loader keys them)."""
    jpeg_files[3].write_bytes(b"\xff\xd8 not a jpeg")
    image = np.random.default_rng(0).integers(0, 256, (192, 256, 3), dtype=np.uint8)
    jpeg_files[5].write_bytes(cv2.imencode(".png", image)[1].tobytes())
    in_decode, after = _decoded_two_ways(
        jpeg_files,
        lambda: RandomResizedCrop(96, seed=2),
        on_error="skip",
        num_threads=threads,
    )
    indices = _EpochIndices([7, 3, 5, 0, 11, 2])
    images, labels = in_decode.__getitems__(indices)
    expected_images, expected_labels = after.__getitems__(indices)
    assert labels.tolist() == expected_labels.tolist() == [7, 5, 0, 11, 2]
    np.testing.assert_array_equal(images.numpy(), expected_images.numpy())


def _decoded_two_ways(
    paths: list[Path], transform: Callable[[], Any], **kwargs: Any
) -> tuple[RAMDataset, RAMDataset]:
    return decoded_two_ways(paths, transform, "decode_crop", **kwargs)
