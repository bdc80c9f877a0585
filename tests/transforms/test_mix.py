"""MixUp / CutMix with soft labels (timm's ``Mixup``: label smoothing, correct_lam, batch
or element mode) on CPU batches and as device modules, and RandomChoice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata import _mixing, gpu, ops
from fastdata._mixing import mix_batch, paste_by_masks
from fastdata._ops_mix import MixPlan
from fastdata.transforms import (
    Compose,
    CutMix,
    MixUp,
    RandomChoice,
    RandomHorizontalFlip,
    RandomInvert,
)

stats = pytest.importorskip("scipy.stats")


def _timm_target(
    labels: torch.Tensor, classes: int, lam: torch.Tensor, smoothing: float
) -> torch.Tensor:
    """timm.data.mixup.mixup_target, per-sample lam."""
    off = smoothing / classes
    on = 1.0 - smoothing + off

    def one_hot(x: torch.Tensor) -> torch.Tensor:
        return torch.full((len(x), classes), off).scatter_(1, x.long().view(-1, 1), on)

    return one_hot(labels) * lam[:, None] + one_hot(labels.flip(0)) * (1.0 - lam[:, None])


def _batch(count: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, 3, 12, 16), dtype=torch.uint8, generator=gen)
    return images, torch.arange(count) % 10  # partners (reversed batch) never share a label


def _lam(
    targets: torch.Tensor, labels: torch.Tensor, smoothing: float, classes: int
) -> torch.Tensor:
    off = smoothing / classes
    on = 1.0 - smoothing + off
    own = targets[torch.arange(len(labels)), labels]
    return (own - off) / (on - off)


def test_mixup_blends_images_and_labels_by_one_lam() -> None:
    images, labels = _batch()
    mixed, targets = MixUp(alpha=0.8, num_classes=10, seed=3)(images, labels)
    assert (
        mixed.dtype == torch.uint8 and targets.shape == (8, 10) and targets.dtype == torch.float32
    )
    lam = _lam(targets, labels, 0.1, 10)
    assert torch.allclose(lam, lam[0].expand(8), atol=1e-6) and 0 < float(lam[0]) < 1
    torch.testing.assert_close(targets, _timm_target(labels, 10, lam, 0.1), atol=1e-6, rtol=0)
    expected = (images.float() * lam[0] + images.flip(0).float() * (1 - lam[0])).round()
    assert (mixed.float() - expected).abs().max() <= 1  # lam recovered through float32
    assert torch.allclose(targets.sum(1), torch.ones(8))


def test_cutmix_pastes_a_box_and_weights_labels_by_its_area() -> None:
    images, labels = _batch()
    cut = CutMix(alpha=1.0, num_classes=10, label_smoothing=0.0, seed=5)
    mixed, targets = cut(images, labels)
    pasted = (mixed != images).any(dim=1) & (mixed == images.flip(0)).all(dim=1)
    kept = (mixed == images).all(dim=1)
    assert bool((pasted | kept).all())
    lam = _lam(targets, labels, 0.0, 10)
    for i in range(8):
        rows, cols = torch.nonzero(~kept[i], as_tuple=True)
        if len(rows):  # one rectangle (pixels equal in both may hide inside it)
            area = (int(rows.max() - rows.min()) + 1) * (int(cols.max() - cols.min()) + 1)
            assert abs(float(1 - lam[i]) - area / (12 * 16)) < 0.2
    plan = ops.CutMix(1.0, 10).plan(np.full((1, 4), 0.3), 8, 12, 16)
    area = plan.boxes[:, 2] * plan.boxes[:, 3]  # type: ignore[index]
    assert np.allclose(plan.lam, 1 - area / (12 * 16))  # correct_lam


def test_element_mode_draws_one_lam_per_sample() -> None:
    images, labels = _batch(16)
    _, targets = MixUp(0.8, 10, mode="elem", seed=1)(images, labels)
    lam = _lam(targets, labels, 0.1, 10)
    assert len(set(np.round(lam.numpy(), 5).tolist())) > 8
    mixed, targets = CutMix(1.0, 10, mode="elem", seed=1)(images.float(), labels)
    assert mixed.dtype == torch.float32


def test_mix_lam_follows_beta() -> None:
    op = ops.MixUp(alpha=0.8, num_classes=10, mode="elem")
    draws = np.random.default_rng(0).random((5000, 4))
    lam = op.plan(draws, 5000, 8, 8).lam
    assert stats.kstest(lam, stats.beta(0.8, 0.8).cdf).pvalue > 1e-3
    half = ops.MixUp(alpha=1.0, num_classes=10, p=0.5, mode="elem").plan(draws, 5000, 8, 8).lam
    assert stats.binomtest(int((half == 1.0).sum()), 5000, 0.5).pvalue > 1e-3


def test_unmixed_batches_keep_images_and_smooth_labels() -> None:
    images, labels = _batch()
    mixed, targets = MixUp(0.8, 10, p=0.0)(images, labels)
    assert torch.equal(mixed, images)
    torch.testing.assert_close(targets, _timm_target(labels, 10, torch.ones(8), 0.1))
    soft = torch.softmax(torch.randn(8, 10), dim=1)
    _, remixed = CutMix(1.0, 10, p=0.0)(images, soft)  # soft targets pass through
    torch.testing.assert_close(remixed, soft)


@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_one_seed_one_result_in_transform_and_module(mode: str) -> None:
    images, labels = _batch(12)
    for cpu_type, device_type in ((MixUp, gpu.DeviceMixUp), (CutMix, gpu.DeviceCutMix)):
        cpu_mix = cpu_type(0.8, 10, mode=mode, seed=9)
        module = device_type.from_op(cpu_mix.op, seed=9)
        assert module.op is cpu_mix.op
        for _ in range(2):
            a_images, a_targets = cpu_mix(images, labels)
            b_images, b_targets = module(images, labels)
            assert torch.equal(a_images, b_images) and torch.equal(a_targets, b_targets)
    hwc = images.permute(0, 2, 3, 1).contiguous()
    out_hwc, _ = CutMix(1.0, 10, layout="HWC", seed=2)(hwc, labels)
    out_chw, _ = CutMix(1.0, 10, seed=2)(images, labels)
    assert torch.equal(out_hwc.permute(0, 3, 1, 2), out_chw)


def test_random_choice_picks_per_call_with_its_probabilities() -> None:
    images, labels = _batch()
    mix = RandomChoice(
        [MixUp(alpha=0.8, num_classes=10), CutMix(alpha=1.0, num_classes=10)], seed=0
    )
    assert not mix.batched
    picks = [type(mix.choose()).__name__ for _ in range(2000)]
    assert stats.binomtest(picks.count("MixUp"), 2000, 0.5).pvalue > 1e-3
    out, targets = mix(images, labels)
    assert out.shape == images.shape and targets.shape == (8, 10)
    weighted = RandomChoice([MixUp(1.0, 10), CutMix(1.0, 10)], p=[0.0, 1.0])
    assert all(isinstance(weighted.choose(), CutMix) for _ in range(50))


def test_random_choice_of_batch_transforms_is_one() -> None:
    images = np.random.default_rng(0).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    choice = RandomChoice([RandomInvert(1.0), RandomHorizontalFlip(1.0)], seed=1)
    assert choice.batched and choice.keeps_size
    pipeline = Compose([choice])
    results = {pipeline(images.copy()).tobytes() for _ in range(20)}
    assert results == {(255 - images).tobytes(), images[:, :, ::-1].copy().tobytes()}


def test_mixing_arguments_are_validated() -> None:
    with pytest.raises(TypeError, match="MixUp needs num_classes"):
        MixUp(alpha=0.8)
    with pytest.raises(ValueError, match="alpha must be positive"):
        CutMix(alpha=0.0, num_classes=3)
    with pytest.raises(ValueError, match="mode must be one of"):
        ops.MixUp(1.0, 3, mode="pair")
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        gpu.DeviceMixUp(1.0, 3, label_smoothing=2)
    images, labels = _batch()
    with pytest.raises(ValueError, match=r"labels must be in \[0, 5\), got values 0..7"):
        MixUp(1.0, 5)(images, labels)
    with pytest.raises(ValueError, match="labels has 7 rows for 8 images"):
        MixUp(1.0, 10)(images, labels[:7])
    with pytest.raises(TypeError, match="images and labels must be tensors"):
        MixUp(1.0, 10)(images.numpy(), labels)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="transforms must hold at least one"):
        RandomChoice([])
    with pytest.raises(ValueError, match="p must give one non-negative weight"):
        RandomChoice([MixUp(1.0, 3)], p=[0.5, 0.5])


def test_the_opencv_and_torch_blends_agree() -> None:
    """Contiguous and channels-last uint8 CPU batches blend through OpenCV, others through
    torch."""
    images, labels = _batch(8)
    contiguous, _ = MixUp(0.8, 10, mode="elem", seed=4)(images, labels)
    strided, _ = MixUp(0.8, 10, mode="elem", seed=4)(
        images.transpose(2, 3).contiguous().transpose(2, 3), labels
    )
    assert (contiguous.int() - strided.int()).abs().max() <= 1
    floats, _ = MixUp(0.8, 10, mode="elem", seed=4)(images.float(), labels)
    assert (floats.round() - contiguous.float()).abs().max() <= 1


def test_channels_last_batches_blend_as_contiguous_ones_and_keep_their_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a collated (B, H, W, C) batch seen as (B, C, H, W), as the loaders hand it over, takes
    # OpenCV's pass per sample (torch's float path costs 20x more), with the same values
    images, labels = _batch(8)
    contiguous, _ = MixUp(0.8, 10, mode="elem", seed=4)(images, labels)
    calls = []
    add_weighted = _mixing.cv2.addWeighted
    monkeypatch.setattr(
        _mixing.cv2, "addWeighted", lambda *args: calls.append(1) or add_weighted(*args)
    )
    channels_last = images.contiguous(memory_format=torch.channels_last)
    mixed, _ = MixUp(0.8, 10, mode="elem", seed=4)(channels_last, labels)
    assert len(calls) == len(images)
    assert torch.equal(mixed, contiguous)
    assert mixed.stride() == channels_last.stride()


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_cutmix_paste_by_box_masks_equals_pasting_sample_by_sample(layout: str) -> None:
    # the device path (one select, no launch per sample) against the CPU path
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 12, 10), dtype=torch.uint8, generator=generator)
    if layout == "HWC":
        images = images.permute(0, 2, 3, 1).contiguous()
    boxes = np.array([[0, 0, 12, 10], [2, 3, 4, 5], [0, 0, 0, 0], [11, 9, 1, 1], [5, 0, 7, 10]])
    plan = MixPlan(lam=np.full(5, 0.5), boxes=boxes)
    targets = torch.eye(5)
    pasted, _ = mix_batch(images, targets, plan, layout)
    assert not torch.equal(pasted, images)
    assert torch.equal(paste_by_masks(images, boxes, layout), pasted)


def _memory(images: torch.Tensor, memory: str) -> torch.Tensor:
    """``images`` ``(B, C, H, W)`` in the given memory (``"HWC"``: a ``(B, H, W, C)``
    tensor)."""
    if memory == "planar":
        return images
    if memory == "channels_last":
        return images.contiguous(memory_format=torch.channels_last)
    if memory == "HWC":
        return images.permute(0, 2, 3, 1).contiguous()
    return images.transpose(2, 3).contiguous().transpose(2, 3)  # strided: no fused path


@pytest.mark.parametrize("memory", ["planar", "channels_last", "HWC", "strided"])
@pytest.mark.parametrize("mode", ["batch", "elem"])
@pytest.mark.parametrize("mixer", [MixUp, CutMix])
@pytest.mark.parametrize("channels_last_out", [False, True])
@pytest.mark.parametrize("lookups", ["compiled", "opencv"])
def test_mixing_with_normalize_gives_normalize_of_the_mixed_batch(  # noqa: PLR0917
    monkeypatch: pytest.MonkeyPatch,
    memory: str,
    mode: str,
    mixer: type,
    channels_last_out: bool,
    lookups: str,
) -> None:
    # mixed and normalized image by image (the compiled lookups, or OpenCV's tables where
    # they were not built), the same bytes as the two steps
    if lookups == "opencv":
        monkeypatch.setattr("fastdata.gpu._normalize_tables.compiled_planes", None)
    images, labels = _batch(9)
    given = _memory(images, memory)
    layout = "HWC" if memory == "HWC" else "CHW"
    normalize = gpu.Normalize(
        [120.0, 110.0, 100.0], [60.0, 55.0, 50.0], layout=layout, channels_last=channels_last_out
    )
    mixed, targets = mixer(0.8, 10, mode=mode, layout=layout, seed=3)(given, labels)
    fused, fused_targets = mixer(0.8, 10, mode=mode, layout=layout, seed=3)(
        given, labels, normalize=normalize
    )
    expected = normalize(mixed)
    assert fused.stride() == expected.stride()
    assert torch.equal(fused, expected)
    assert torch.equal(fused_targets, targets)


def test_mixing_with_normalize_writes_no_mixed_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_expected(*args: object) -> None:
        raise AssertionError("the mixed batch was written")

    monkeypatch.setattr(_mixing, "mix_batch", not_expected)
    images, labels = _batch(8)
    normalize = gpu.Normalize([120.0, 110.0, 100.0], [60.0, 55.0, 50.0])
    mix = RandomChoice([MixUp(0.8, 10, seed=1), CutMix(1.0, 10, seed=2)], seed=0)
    for _ in range(4):
        out, targets = mix(images.contiguous(memory_format=torch.channels_last), labels, normalize)
        assert out.dtype == torch.float32 and targets.shape == (8, 10)
    floats = images.float()  # not uint8: mixed, then normalized as a batch
    with pytest.raises(AssertionError, match="the mixed batch was written"):
        MixUp(0.8, 10)(floats, labels, normalize=normalize)
    with pytest.raises(
        TypeError, match=r"normalize must be a fastdata\.gpu\.Normalize or None, got function"
    ):
        MixUp(0.8, 10)(images, labels, normalize=lambda x: x)  # type: ignore[arg-type]


@pytest.mark.parametrize("memory", ["planar", "channels_last", "HWC"])
def test_blend_weights_of_zero_and_one_give_opencvs_bytes(memory: str) -> None:
    """A sample that keeps all of itself (lam 1: unmixed) or takes all of its partner
    (lam 0) skips the blend: the same bytes as OpenCV's blend, alone and normalized."""
    images, _ = _batch(8, seed=5)
    lam = np.array([1.0, 0.0, 0.3, 1.0, 0.0, 0.75, 1.0, 0.5])
    layout = "HWC" if memory == "HWC" else "CHW"
    given = _memory(images, memory)
    targets = torch.eye(8)
    mixed, _ = mix_batch(given, targets, MixPlan(lam, None), layout)
    interleaved = images.permute(0, 2, 3, 1).numpy()
    for k, weight in enumerate(lam.tolist()):
        own, partner = interleaved[k], interleaved[7 - k]
        expected = _mixing.cv2.addWeighted(own, weight, partner, 1.0 - weight, 0.0)
        got = mixed[k] if layout == "HWC" else mixed[k].permute(1, 2, 0)
        np.testing.assert_array_equal(got.numpy(), expected)
    normalize = gpu.Normalize([120.0, 110.0, 100.0], [60.0, 55.0, 50.0], layout=layout)
    image_at = _mixing.mixed_images(given, MixPlan(lam, None), layout)
    assert image_at is not None
    fused = normalize.normalize_images_of(given, image_at)
    assert fused is not None and torch.equal(fused, normalize(mixed))
