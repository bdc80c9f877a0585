"""A dataset reads its transform's declarations once, into a plan every batch follows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fastdata.datasets import RAMDataset, ShardDataset
from fastdata.transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from tests.datasets.conftest import SIZE, Reference


def _hwc(batch: torch.Tensor) -> np.ndarray:
    return batch.permute(0, 2, 3, 1).numpy()


def test_a_per_sample_callable_is_planned_per_sample(raw_shards: Reference) -> None:
    def crop(image: torch.Tensor) -> torch.Tensor:  # (C, H, W), torchvision style
        return image[:, 2:8, 1:5]

    with pytest.warns(UserWarning, match=r"fields \('mask',\) \(masks, boxes\) are not moved"):
        dataset = ShardDataset(raw_shards.path, fields=("image", "label", "mask"), transform=crop)
    plan = dataset.plan
    assert plan.per_sample and not plan.batched and plan.field == "image"
    assert plan.image_size == SIZE and plan.output_size is None and plan.mask_fields == ()
    images, _, masks = dataset.__getitems__([3, 0])
    assert images.shape == (2, 3, 6, 4)
    np.testing.assert_array_equal(_hwc(images), raw_shards.images[[3, 0], 2:8, 1:5])
    np.testing.assert_array_equal(masks.numpy(), raw_shards.masks[[3, 0]])  # untouched


def test_a_duck_typed_batched_flag_does_not_make_a_batch_transform(raw_shards: Reference) -> None:
    """Only a BatchTransform is called per batch: a callable that merely claims it is
    gets samples, as any torchvision-style callable does."""

    class Claims:
        batched = True
        in_place = False
        min_input_side = 4

        def __call__(self, image: torch.Tensor) -> torch.Tensor:
            assert image.shape == (3, *SIZE)  # one (C, H, W) sample
            return image

    dataset = ShardDataset(raw_shards.path, fields=("image",), transform=Claims())
    assert dataset.plan.per_sample and dataset.decode_min_side is None
    np.testing.assert_array_equal(_hwc(dataset.__getitems__([1, 2])), raw_shards.images[[1, 2]])


@pytest.mark.parametrize(
    ("transform", "reads_input_only", "output_size", "min_side"),
    [
        (RandomResizedCrop(6, seed=0), True, (6, 6), None),
        (RandomHorizontalFlip(seed=0), False, SIZE, None),
        (Resize(8), True, (9, 8), 8),
        (
            Compose([RandomResizedCrop((5, 4), seed=0), RandomHorizontalFlip(seed=0)]),
            True,
            (5, 4),
            None,
        ),
        (Compose([RandomHorizontalFlip(seed=0), Resize(8), CenterCrop(6)]), False, (6, 6), 8),
    ],
)
def test_a_batch_transform_is_planned_from_its_declarations(
    raw_shards: Reference,
    transform: Any,
    reads_input_only: bool,
    output_size: tuple[int, int],
    min_side: int | None,
) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label"), transform=transform)
    plan = dataset.plan
    assert plan.batched and not plan.per_sample
    assert plan.reads_input_only is reads_input_only
    assert plan.output_size == output_size and plan.decode_min_side == min_side
    images, labels = dataset.__getitems__([4, 1, 7])
    assert images.shape == (3, 3, *output_size)
    np.testing.assert_array_equal(labels.numpy(), raw_shards.labels[[4, 1, 7]])


def test_masks_move_with_the_image_and_turn_off_reduced_decoding(raw_shards: Reference) -> None:
    transform = Compose([Resize(8), RandomHorizontalFlip(p=1.0)])
    dataset = ShardDataset(raw_shards.path, fields=("image", "mask"), transform=transform)
    assert dataset.plan.mask_fields == ("mask",) and dataset.plan.decode_min_side is None
    assert dataset.plan.rows_in_place("mask")  # Resize reads the stored masks in place
    images, masks = dataset.__getitems__([0, 5])
    assert images.shape == (2, 3, 9, 8) and masks.shape == (2, 9, 8)


def test_an_encoded_field_has_no_stored_size_to_check(encoded_shards: Reference) -> None:
    dataset = ShardDataset(encoded_shards.path, transform=CenterCrop(50))  # sizes vary
    assert dataset.plan.image_size is None and dataset.plan.output_size is None
    raw_bytes = ShardDataset(encoded_shards.path, transform=CenterCrop(4), decode=False)
    assert raw_bytes.plan.field is None  # bytes are not transformed


def test_a_transform_that_is_not_callable_is_refused(raw_shards: Reference) -> None:
    with pytest.raises(TypeError, match="transform must be callable or None, got int"):
        ShardDataset(raw_shards.path, transform=3)  # type: ignore[arg-type]


def test_datasets_take_the_layout_names_and_refuse_the_former_spelling(
    raw_shards: Reference,
) -> None:
    hwc = ShardDataset(raw_shards.path, fields=("image",), layout="HWC")
    assert hwc.__getitems__([2]).shape == (1, *SIZE, 3)
    with pytest.raises(ValueError, match=r"got 'BHWC' \(now spelled 'HWC'"):
        ShardDataset(raw_shards.path, fields=("image",), layout="BHWC")
    images = np.zeros((2, *SIZE, 3), np.uint8)
    with pytest.raises(ValueError, match=r"layout must be one of \('CHW', 'HWC'\), got 'auto'"):
        RAMDataset.from_arrays(images, layout="auto")
