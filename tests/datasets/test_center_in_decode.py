"""Centre-crop-in-decode: a dataset over encoded images whose transform starts with
``Resize`` + ``CenterCrop`` decodes each image, resizes and crops it into its row of the
batch, with the pixels those transforms give after the decode."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from fastdata import RAMDataset
from fastdata.errors import DecodeError
from fastdata.transforms import CenterCrop, Compose, RandomHorizontalFlip, Resize
from tests.datasets.conftest import decoded_two_ways, write_jpegs

COUNT = 9


@pytest.fixture
def jpeg_files(tmp_path: Path) -> list[Path]:
    return write_jpegs(tmp_path, COUNT, 192, 256)


@pytest.mark.parametrize(
    ("side", "crop"),
    # reduced decodes, full (under 1.33x: bilinear only; 1.5x: low-pass filtered first),
    # enlarging
    [(80, 64), (150, (120, 140)), (128, (112, 100)), (256, 224), (40, 40)],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_the_pixels_of_resize_then_center_crop(
    jpeg_files: list[Path], side: int, crop: int | tuple[int, int], threads: int
) -> None:
    in_decode, after = _decoded_two_ways(
        jpeg_files, lambda: Compose([Resize(side), CenterCrop(crop)]), num_threads=threads
    )
    indices = list(range(COUNT))
    got, expected = in_decode.__getitems__(indices), after.__getitems__(indices)
    np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
    assert got[1].tolist() == expected[1].tolist() == indices


def test_the_rest_of_the_transform_a_png_and_a_skipped_file(jpeg_files: list[Path]) -> None:
    jpeg_files[2].write_bytes(b"\xff\xd8 not a jpeg")
    gray = np.random.default_rng(1).integers(0, 256, (200, 170), dtype=np.uint8)
    jpeg_files[4].write_bytes(cv2.imencode(".png", gray)[1].tobytes())

    def evaluation() -> Compose:
        return Compose([Resize(100), CenterCrop(96), RandomHorizontalFlip(p=1.0)])

    in_decode, after = _decoded_two_ways(jpeg_files, evaluation, on_error="skip")
    assert isinstance(in_decode.plan.after_decode, RandomHorizontalFlip)
    for settings in ({}, {"num_workers": 2}):
        got = [b for b in in_decode.loader(batch_size=4, **settings)]
        expected = [b for b in after.loader(batch_size=4)]
        for (images, labels), (expected_images, expected_labels) in zip(got, expected, strict=True):
            assert labels.tolist() == expected_labels.tolist()
            np.testing.assert_array_equal(images.numpy(), expected_images.numpy())
        assert 2 not in np.concatenate([labels.numpy() for _, labels in got])


def test_bad_bytes_raise_and_small_images_are_refused(jpeg_files: list[Path]) -> None:
    jpeg_files[1].write_bytes(b"\xff\xd8 not a jpeg")
    raising = RAMDataset(
        jpeg_files, None, Compose([Resize(64), CenterCrop(60)]), show_progress=False
    )
    with pytest.raises(DecodeError, match=r"dataset\[1\]"):
        raising.__getitems__([0, 1])
    too_wide = RAMDataset(
        jpeg_files, None, Compose([Resize(64), CenterCrop((64, 400))]), show_progress=False
    )
    with pytest.raises(ValueError, match="CenterCrop size"):
        too_wide.__getitems__([0])


def test_only_a_leading_default_kernel_resize_and_center_crop_are_handed_over(
    jpeg_files: list[Path],
) -> None:
    def plan(transform: Any, **kwargs: Any) -> Any:
        dataset = RAMDataset(jpeg_files, None, transform, show_progress=False, **kwargs)
        return dataset.plan.decode_center

    assert plan(Compose([Resize(64), CenterCrop(60)])) is not None
    assert plan(Compose([Resize(64), CenterCrop(60), RandomHorizontalFlip()])) is not None
    assert plan(Compose([Resize(64), CenterCrop(60)]), decode=False) is None
    assert plan(Compose([CenterCrop(60), Resize(64)])) is None
    assert plan(Compose([Resize(64, interpolation=cv2.INTER_AREA), CenterCrop(60)])) is None
    assert plan(Resize(64)) is None


def _decoded_two_ways(
    paths: list[Path], transform: Callable[[], Any], **kwargs: Any
) -> tuple[RAMDataset, RAMDataset]:
    return decoded_two_ways(paths, transform, "decode_center", **kwargs)
