from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from fastdata._codec import decode_image
from fastdata._crop import DRAWS_PER_BOX
from fastdata._draws import UniformDraws
from fastdata.decode import _base as base_module
from fastdata.decode import create_decoder
from fastdata.decode._geometry import random_box
from fastdata.decode.cpu import CpuDecoder
from fastdata.errors import DecodeError, OnError
from fastdata.ops import RandomResizedCrop
from tests.decode.conftest import (
    BAD,
    GOOD,
    damaged_jpeg,
    encode,
    exif_rotated_jpeg,
    rgb_jpeg,
    smooth_rgb,
)

# A JPEG decode differs from the source pixels by its compression error; against a
# reference (PIL full decode + OpenCV area resize), the reduced-size DCT decode adds at most
# a few levels. Bound used throughout: mean absolute difference <= 3 levels of 255.
MEAN_TOLERANCE = 3.0


def _reference(data: bytes, size: tuple[int, int]) -> np.ndarray:
    """Full PIL decode, centre crop of the output's aspect, area resize: ``(H, W, 3)``."""
    rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    height, width = rgb.shape[:2]
    out_h, out_w = size
    if height * out_w > width * out_h:
        box_h, box_w = round(width * out_h / out_w), width
    else:
        box_h, box_w = height, round(height * out_w / out_h)
    top, left = (height - box_h) // 2, (width - box_w) // 2
    region = rgb[top : top + box_h, left : left + box_w]
    return cv2.resize(region, (out_w, out_h), interpolation=cv2.INTER_AREA)


@pytest.mark.parametrize("size", [(64, 64), (100, 150), (200, 100)])
def test_matches_reference_within_jpeg_tolerance(size: tuple[int, int]) -> None:
    data = rgb_jpeg(480, 640, seed=3)
    decoder = create_decoder("cpu", size=size, num_threads=2)
    images = decoder([data, data])
    assert images.shape == (2, 3, *size) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    got = images[0].permute(1, 2, 0).numpy().astype(np.int16)
    diff = np.abs(got - _reference(data, size))
    assert diff.mean() <= MEAN_TOLERANCE


def test_reduced_decode_is_close_to_full_decode() -> None:
    data = rgb_jpeg(800, 800, seed=4)
    reduced = CpuDecoder(100, num_threads=1)([data])[0].numpy().astype(np.int16)
    full = cv2.resize(smooth_rgb(800, 800, seed=4), (100, 100), interpolation=cv2.INTER_AREA)
    assert np.abs(reduced - full.transpose(2, 0, 1)).mean() <= MEAN_TOLERANCE


def test_all_good_kinds_decode_to_rgb_and_gray(images: dict[str, bytes]) -> None:
    batch = [images[name] for name in GOOD]
    rgb = create_decoder("cpu", size=(48, 64))(batch)
    assert rgb.shape == (len(GOOD), 3, 48, 64)
    gray = create_decoder("cpu", size=(48, 64), grayscale=True)(batch)
    assert gray.shape == (len(GOOD), 1, 48, 64)
    # CMYK and grayscale JPEGs carry the same picture as the colour one
    color, cmyk = rgb[0].float(), rgb[GOOD.index("cmyk")].float()
    assert (color - cmyk).abs().mean() <= 2 * MEAN_TOLERANCE
    gray_jpeg = rgb[GOOD.index("gray")]
    assert torch.equal(gray_jpeg[0], gray_jpeg[1]) and torch.equal(gray_jpeg[1], gray_jpeg[2])


@pytest.mark.parametrize("bad", BAD)
def test_on_error_raise(images: dict[str, bytes], bad: str) -> None:
    decoder = create_decoder("cpu", size=32)
    with pytest.raises(DecodeError, match="batch item 1"):
        decoder([images["color"], images[bad]])


def test_on_error_skip_keeps_the_rest(images: dict[str, bytes]) -> None:
    batch = [images["color"], *(images[b] for b in BAD), images["gray"]]
    decoded = create_decoder("cpu", size=32, on_error="skip").decode(batch)
    assert decoded.kept.tolist() == [0, len(batch) - 1]
    assert decoded.images.shape == (2, 3, 32, 32)
    alone = create_decoder("cpu", size=32)([images["color"]])
    assert torch.equal(decoded.images[0], alone[0])


def test_on_error_warn(images: dict[str, bytes]) -> None:
    decoder = create_decoder("cpu", size=32, on_error="warn")
    with pytest.warns(RuntimeWarning, match="skipped a sample: "):
        decoded = decoder.decode([images["corrupt"], images["color"]])
    assert decoded.kept.tolist() == [1]
    empty = create_decoder("cpu", size=32, on_error="skip").decode([images["empty"]])
    assert empty.images.shape == (0, 3, 32, 32) and empty.kept.numel() == 0


def test_a_damaged_jpeg_is_refused_or_left_out_or_kept_with_a_warning(
    images: dict[str, bytes],
) -> None:
    batch = [images["color"], damaged_jpeg(), images["color"]]
    for random_crop in (None, True):  # a whole image, and a box of one (reduced decode)
        with pytest.raises(DecodeError, match=r"Corrupt JPEG data: .*: batch item 1$"):
            create_decoder("cpu", size=32, random_crop=random_crop).decode(batch)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # quietly
            skipped = create_decoder("cpu", size=32, on_error="skip").decode(batch)
        assert skipped.kept.tolist() == [0, 2]
        decoder = create_decoder("cpu", size=32, random_crop=random_crop, on_error="warn")
        with pytest.warns(RuntimeWarning, match=r"kept a damaged sample: .*batch item 1$"):
            kept = decoder.decode(batch)
        assert kept.kept.tolist() == [0, 1, 2] and kept.images.shape == (3, 3, 32, 32)
        assert [(e.source, e.kept) for e in decoder.last_errors] == [("batch item 1", True)]


def test_decode_errors_carry_their_reason_whatever_the_policy(images: dict[str, bytes]) -> None:
    for policy in ("skip", "warn", OnError.SKIP):
        decoder = create_decoder("cpu", size=32, on_error=policy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decoder.decode([images["color"], images["truncated"], images["empty"]])
        assert [(error.source, error.reason) for error in decoder.last_errors] == [
            ("batch item 1", "truncated"),
            ("batch item 2", "empty"),
        ]
    assert create_decoder("cpu", size=32, on_error="raise").on_error is OnError.RAISE
    assert "on_error='skip'" in repr(create_decoder("cpu", size=32, on_error=OnError.SKIP))


def test_random_crop_is_seeded_and_varies(images: dict[str, bytes]) -> None:
    batch = [images["large"]] * 4
    first = create_decoder("cpu", size=64, random_crop=True, seed=7)(batch)
    again = create_decoder("cpu", size=64, random_crop=RandomResizedCrop(64), seed=7)(batch)
    assert torch.equal(first, again)
    assert not torch.equal(first[0], first[1])  # each sample gets its own crop


def test_accepts_bytes_arrays_and_tensors(images: dict[str, bytes]) -> None:
    data = images["color"]
    as_array = np.frombuffer(data, np.uint8)
    as_tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = create_decoder("cpu", size=32)([data, as_array, as_tensor])
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


def test_rejects_bad_inputs() -> None:
    decoder = create_decoder("cpu", size=32)
    with pytest.raises(TypeError, match="encoded must be a list"):
        decoder(b"\xff\xd8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="encoded image 0 must be a 1-D uint8"):
        decoder([torch.zeros(4, dtype=torch.float32)])
    with pytest.raises(TypeError, match="encoded image 0 must be a 1-D uint8 array"):
        decoder([np.zeros((2, 2), np.uint8)])
    with pytest.raises(TypeError, match="encoded image 0 must be bytes"):
        decoder([12])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="num_threads must be a positive int or None"):
        CpuDecoder(32, num_threads=0)
    decoder.close()


def test_rejects_bad_options() -> None:
    with pytest.raises(TypeError, match=r"random_crop must be a RandomResizedCrop \(the transform"):
        create_decoder("cpu", size=32, random_crop="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_error must be one of"):
        create_decoder("cpu", size=32, on_error="ignore")
    with pytest.raises(ValueError, match="backend must be one of"):
        create_decoder("pil", size=32)


def test_reduced_random_crops_stay_on_their_box() -> None:
    """A 1/2..1/8-scale decode must not shift the crop box (sub-pixel resampling)."""
    data = rgb_jpeg(480, 640, seed=6)
    crop = RandomResizedCrop((48, 64))
    got = create_decoder("cpu", size=(48, 64), random_crop=crop, seed=11)([data] * 6)
    draws = UniformDraws(11).uniform(6, DRAWS_PER_BOX)  # the decoder's draws
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    for row in range(6):
        box = random_box((480, 640), crop, draws[row])
        region = full[box.top : box.top + box.height, box.left : box.left + box.width]
        want = cv2.resize(region, (64, 48), interpolation=cv2.INTER_AREA)
        diff = np.abs(got[row].permute(1, 2, 0).numpy().astype(np.int16) - want)
        assert diff.mean() <= 1.5


def test_exif_orientation_is_applied_like_preprocess_and_ram_dataset() -> None:
    """A JPEG tagged 'rotate 90' decodes as displayed, the rule of every CPU path: as the
    displayed image stored losslessly (crop boxes drawn on it; the JPEG still decodes at a
    reduced scale, so equal up to resampling)."""
    data = exif_rotated_jpeg(400, 640, seed=8)
    displayed = decode_image(data)
    assert displayed.shape == (640, 400, 3)
    ok, png = cv2.imencode(".png", cv2.cvtColor(displayed, cv2.COLOR_RGB2BGR))
    assert ok
    as_stored = create_decoder("cpu", size=(40, 25), seed=1)([rgb_jpeg(400, 640, seed=8)])
    for random_crop in (False, True):
        got = create_decoder("cpu", size=(40, 25), random_crop=random_crop, seed=1)([data])
        want = create_decoder("cpu", size=(40, 25), random_crop=random_crop, seed=1)(
            [png.tobytes()]
        )
        assert (got.float() - want.float()).abs().mean() <= MEAN_TOLERANCE
    centre = create_decoder("cpu", size=(40, 25), seed=1)([data])
    assert (centre.float() - as_stored.float()).abs().mean() > 4 * MEAN_TOLERANCE


def test_cuda_target_decodes_into_pinned_memory_then_copies_without_blocking(
    images: dict[str, bytes], fake_cuda_uploads: list[tuple[tuple[int, ...], str]]
) -> None:
    # A pageable `.to("cuda")` blocks the host until the work queued on the current stream
    # (the training step) is done: the batch is decoded into pinned memory instead and
    # handed to copy_to_device (pinned, non_blocking).
    out = CpuDecoder(24, device="cuda:0", num_threads=1)([images["color"]] * 2)
    assert out.shape == (2, 3, 24, 24)
    assert fake_cuda_uploads == [((2, 24, 24, 3), "pinned"), ((2, 3, 24, 24), "cuda:0")]
    fake_cuda_uploads.clear()
    CpuDecoder(24, num_threads=1)([images["color"]])
    assert fake_cuda_uploads == [((1, 24, 24, 3), "pageable")]  # a CPU target: no pinning


def test_default_threads_are_shared_between_the_ranks_of_a_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base_module, "usable_cpus", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert base_module.resolve_num_threads(None) == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun, 4 ranks on this machine
    assert base_module.resolve_num_threads(None) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert base_module.resolve_num_threads(None) == 1
    assert base_module.resolve_num_threads(3) == 3  # given: as is


def test_reduced_decoding_maps_boxes_exactly_when_sides_are_not_multiples_of_the_factor() -> None:
    # 333 rows at 1/4 scale decode to ceil(333 / 4) = 84 rows, each covering 4 source rows:
    # mapping by 84 / 333 instead of 1 / 4 shifted the far edge by ~3 source rows, 4-5
    # levels off an exact area average on a textured photo.
    rng = np.random.default_rng(7)
    rgb = smooth_rgb(333, 500, seed=7).astype(np.float32) + rng.normal(0, 10, (333, 500, 3))
    data = encode(Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)), quality=90)
    full = Image.open(io.BytesIO(data)).convert("RGB")
    for size in (64, 48):
        got = create_decoder("cpu", size=size)([data])[0].permute(1, 2, 0).numpy()
        left = (500 - 333) // 2
        area = full.resize((size, size), Image.Resampling.BOX, box=(left, 0, left + 333, 333))
        diff = np.abs(got.astype(np.float32) - np.asarray(area, dtype=np.float32)).mean()
        assert diff <= 2.0, f"size {size}: mean abs diff {diff:.2f} from an exact area average"
