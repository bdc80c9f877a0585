"""One layout vocabulary for datasets and device modules."""

from __future__ import annotations

import warnings

import pytest
import torch

from fastdata._layout import check_layout, resolve_layout
from fastdata.gpu import DeviceRandomHorizontalFlip, DeviceRandomResizedCrop, Normalize


def test_the_names_and_auto() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_layout("CHW") == "CHW"
        assert check_layout("HWC") == "HWC"
        assert check_layout("auto", auto=True) == "auto"


@pytest.mark.parametrize(("old", "new"), [("BCHW", "CHW"), ("BHWC", "HWC")])
def test_former_batch_spellings_are_refused_naming_the_new_one(old: str, new: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"layout must be one of \('CHW', 'HWC'\), got '{old}' \(now spelled '{new}'",
    ):
        check_layout(old)


@pytest.mark.parametrize(
    ("layout", "auto", "error", "match"),
    [
        ("NCHW", False, ValueError, r"layout must be one of \('CHW', 'HWC'\), got 'NCHW'"),
        ("auto", False, ValueError, r"layout must be one of \('CHW', 'HWC'\), got 'auto'"),
        ("chw", True, ValueError, r"one of \('CHW', 'HWC', 'auto'\), got 'chw'"),
        (3, True, TypeError, r"layout must be a string, one of \('CHW', 'HWC', 'auto'\), got 3"),
    ],
)
def test_bad_values_are_refused(layout: object, auto: bool, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        check_layout(layout, auto=auto)  # type: ignore[arg-type]


def test_auto_resolves_by_the_channel_dim() -> None:
    assert resolve_layout((2, 3, 8, 9), "auto", 3) == "CHW"
    assert resolve_layout((2, 8, 9, 3), "auto", 3) == "HWC"
    assert resolve_layout((2, 3, 8, 3), "HWC", 3) == "HWC"
    with pytest.raises(ValueError, match=r"pass layout='CHW' or layout='HWC'"):
        resolve_layout((2, 3, 8, 3), "auto", 3)


def test_device_modules_refuse_the_old_spellings() -> None:
    for make in (
        lambda: Normalize([1.0] * 3, [1.0] * 3, layout="BHWC"),
        lambda: DeviceRandomHorizontalFlip(p=0.0, layout="BHWC"),
        lambda: DeviceRandomResizedCrop(4, layout="BHWC", seed=0),
    ):
        with pytest.raises(ValueError, match=r"got 'BHWC' \(now spelled 'HWC'"):
            make()


def test_device_modules_take_the_layout_names() -> None:
    images = torch.randint(0, 255, (2, 6, 5, 3), dtype=torch.uint8)  # (B, H, W, C)
    normalize = Normalize([1.0] * 3, [1.0] * 3, layout="HWC")
    flip = DeviceRandomHorizontalFlip(p=0.0, layout="HWC")
    crop = DeviceRandomResizedCrop(4, layout="HWC", seed=0)
    torch.testing.assert_close(normalize(images), images.permute(0, 3, 1, 2).float() - 1)
    assert torch.equal(flip(images), images)
    assert crop(images).shape == (2, 4, 4, 3)
