from __future__ import annotations

import pytest
import torch

from fastdata.gpu import DeviceRandomHorizontalFlip, DeviceRandomResizedCrop


def _images(batch: int = 6, height: int = 8, width: int = 10) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (batch, 3, height, width), dtype=torch.uint8, generator=gen)


def test_flip_is_seeded_and_per_sample() -> None:
    images = _images(32)
    out_a = DeviceRandomHorizontalFlip(seed=5)(images)
    out_b = DeviceRandomHorizontalFlip(seed=5)(images)
    assert torch.equal(out_a, out_b)
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out_a, images, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out_a, images, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 0 < sum(flipped) < 32
    assert torch.equal(DeviceRandomHorizontalFlip(p=1.0)(images), images.flip(-1))
    assert torch.equal(DeviceRandomHorizontalFlip(p=0.0)(images), images)


def test_flip_masks_alike_in_both_layouts() -> None:
    images = _images(16)
    flip = DeviceRandomHorizontalFlip(seed=2)
    out, masks = flip(images, images[:, 0])
    assert torch.equal(masks, out[:, 0])
    bhwc = images.permute(0, 2, 3, 1).contiguous()
    out_bhwc, masks_bhwc = DeviceRandomHorizontalFlip(layout="HWC", seed=2)(bhwc, bhwc[..., :1])
    assert torch.equal(out_bhwc.permute(0, 3, 1, 2), out)
    assert torch.equal(masks_bhwc[..., 0], masks)


def test_resized_crop_identity_is_exact() -> None:
    images = _images(height=8, width=10)
    crop = DeviceRandomResizedCrop((8, 10), scale=(1.0, 1.0), ratio=(10 / 8, 10 / 8), seed=0)
    assert torch.equal(crop(images), images)
    as_float = images.float() / 3
    torch.testing.assert_close(crop(as_float), as_float, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_resized_crop_at_crop_size_is_a_slice(layout: str) -> None:
    images = _images(height=12, width=12)
    masks = images[:, 1] // 64
    options = {"scale": (0.25, 0.25), "ratio": (1.0, 1.0), "layout": layout, "seed": 7}
    boxes = DeviceRandomResizedCrop(6, **options).sample_boxes(6, 12, 12)  # type: ignore[arg-type]
    given = images.permute(0, 2, 3, 1) if layout == "HWC" else images
    out, out_masks = DeviceRandomResizedCrop(6, **options)(given, masks)  # type: ignore[arg-type]
    out = out.permute(0, 3, 1, 2) if layout == "HWC" else out
    assert out.shape == (6, 3, 6, 6)
    assert out_masks.dtype == torch.uint8
    for i, (x0, y0, w, h) in enumerate(boxes.tolist()):
        assert (w, h) == (6, 6)
        assert torch.equal(out[i], images[i, :, y0 : y0 + h, x0 : x0 + w])
        assert torch.equal(out_masks[i], masks[i, y0 : y0 + h, x0 : x0 + w])


def test_resized_crop_boxes_stay_inside_and_follow_the_ranges() -> None:
    crop = DeviceRandomResizedCrop(4, scale=(0.1, 0.9), ratio=(0.5, 2.0), seed=3)
    boxes = crop.sample_boxes(512, 30, 50)
    x0, y0, w, h = boxes.unbind(1)
    assert bool((x0 >= 0).all() and (y0 >= 0).all())
    assert bool((x0 + w <= 50).all() and (y0 + h <= 30).all())
    area = (w * h).double() / (30 * 50)
    assert bool((area > 0.08).all() and (area < 0.95).all())
    assert bool(((w / h) > 0.4).all() and ((w / h) < 2.3).all())
    assert len({tuple(b) for b in boxes.tolist()}) > 400


def test_resized_crop_falls_back_to_a_centre_crop() -> None:
    crop = DeviceRandomResizedCrop(4, scale=(0.9, 1.0), ratio=(1.0, 1.0), seed=0)
    boxes = crop.sample_boxes(3, 4, 40)
    assert boxes.tolist() == [[18, 0, 4, 4]] * 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_resized_crop_keeps_float_dtypes(dtype: torch.dtype) -> None:
    images = _images().to(dtype)
    out, masks = DeviceRandomResizedCrop((3, 5), seed=1)(images, torch.zeros(6, 8, 10).long())
    assert out.dtype == dtype
    assert out.shape == (6, 3, 3, 5)
    assert masks.dtype == torch.int64
    assert masks.shape == (6, 3, 5)


def test_seed_restarts_the_sequence() -> None:
    crop = DeviceRandomResizedCrop(4, seed=9)
    first = crop.sample_boxes(8, 20, 20)
    assert not torch.equal(first, crop.sample_boxes(8, 20, 20))
    crop.manual_seed(9)
    assert torch.equal(first, crop.sample_boxes(8, 20, 20))


def test_set_epoch_draws_each_epoch_from_the_seed_and_the_epoch_alone() -> None:
    first, second = DeviceRandomResizedCrop(4, seed=9), DeviceRandomResizedCrop(4, seed=9)
    first.sample_boxes(8, 20, 20)  # the run that went through epoch 0 first
    first.set_epoch(1)
    second.set_epoch(1)  # a resumed run starting at epoch 1
    boxes = first.sample_boxes(8, 20, 20)
    assert torch.equal(boxes, second.sample_boxes(8, 20, 20))
    second.set_epoch(2)
    assert not torch.equal(boxes, second.sample_boxes(8, 20, 20))
    images = _images(32)
    flips = [DeviceRandomHorizontalFlip(seed=5) for _ in range(2)]
    for flip in flips:
        flip.set_epoch(3)
    assert torch.equal(flips[0](images), flips[1](images))
    assert "seed=9" in repr(second)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: DeviceRandomHorizontalFlip(p=1.5), ValueError, r"p must be in \[0, 1\], got 1.5"),
        (lambda: DeviceRandomHorizontalFlip(layout="NHWC"), ValueError, "layout must be one of"),
        (lambda: DeviceRandomHorizontalFlip(seed="1"), TypeError, "seed must be an int"),
        (lambda: DeviceRandomResizedCrop(0), ValueError, "size must be a positive int"),
        (lambda: DeviceRandomResizedCrop((2, 3, 4)), ValueError, "size must be a positive"),
        (lambda: DeviceRandomResizedCrop(4, scale=(0.5, 0.2)), ValueError, "scale must satisfy"),
        (lambda: DeviceRandomResizedCrop(4, ratio=(0.0, 1.0)), ValueError, "ratio must satisfy"),
    ],
)
def test_constructor_validation(build: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()  # type: ignore[operator]


def test_forward_validation() -> None:
    flip, crop = DeviceRandomHorizontalFlip(), DeviceRandomResizedCrop(4)
    with pytest.raises(
        ValueError, match=r"images must be a 4-D tensor in layout CHW, got \(3, 8, 10\)"
    ):
        flip(_images()[0])
    with pytest.raises(ValueError, match=r"masks of shape \(6, 8, 9\) do not match images"):
        crop(_images(), torch.zeros(6, 8, 9, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"masks of shape \(5, 8, 10\) do not match"):
        flip(_images(), torch.zeros(5, 8, 10, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_resized_crop_keeps_channels_last(dtype: torch.dtype) -> None:
    images = (torch.rand(4, 3, 16, 20) * 255).to(dtype)
    crop = DeviceRandomResizedCrop((8, 6), seed=0)
    planar = crop(images)
    crop.manual_seed(0)
    out = crop(images.contiguous(memory_format=torch.channels_last))
    assert isinstance(out, torch.Tensor) and isinstance(planar, torch.Tensor)
    assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (4, 3, 8, 6)
    assert planar.is_contiguous()
    torch.testing.assert_close(out, planar, rtol=0, atol=0)
