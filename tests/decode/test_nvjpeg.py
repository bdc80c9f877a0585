"""The nvjpeg backend. Its logic runs on CPU in CI with torchvision's ``decode_jpeg``
replaced by an OpenCV stand-in that, like the real one, fails a whole batch on one bad
image; the ``gpu`` tests run the real thing on a CUDA device."""

from __future__ import annotations

import warnings
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from fastdata._codec import orient
from fastdata.decode import create_decoder
from fastdata.decode import nvjpeg as nvjpeg_module
from fastdata.decode._geometry import Box
from fastdata.decode.nvjpeg import NvJpegDecoder, orient_chw, oriented_region, stored_box
from fastdata.errors import DecodeError
from tests.decode.conftest import BAD, GOOD, bogus_huffman_jpeg, exif_rotated_jpeg, rgb_jpeg

# nvJPEG and libjpeg-turbo differ by at most a couple of levels per pixel (IDCT and chroma
# upsampling), and the device resize (area average or bilinear) differs from the cpu
# backend's (a DCT-scaled decode, then OpenCV area or bilinear) by about one level: the
# bound is a mean absolute difference of 3 levels of 255.
MEAN_TOLERANCE = 3.0


class FakeDecodeJpeg:
    """OpenCV stand-in for torchvision's decode_jpeg (full-size, CHW, all-or-nothing, EXIF
    orientation ignored as nvJPEG does: the pixels as stored)."""

    def __init__(self, grayscale: bool) -> None:
        self.grayscale = grayscale
        self.calls: list[int] = []

    def _one(self, data: torch.Tensor, device: torch.device) -> torch.Tensor:
        flag = cv2.IMREAD_GRAYSCALE if self.grayscale else cv2.IMREAD_COLOR
        flag |= cv2.IMREAD_IGNORE_ORIENTATION
        image = cv2.imdecode(data.numpy(), flag)
        if image is None:
            raise RuntimeError("nvjpeg: bad image")
        if not self.grayscale:
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        return torch.from_numpy(image.reshape(*image.shape[:2], -1)).permute(2, 0, 1).to(device)

    def __call__(self, data: Any, device: torch.device) -> Any:
        if isinstance(data, list):
            self.calls.append(len(data))
            return [self._one(item, device) for item in data]
        self.calls.append(1)
        return self._one(data, device)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeDecodeJpeg]:
    made: dict[str, FakeDecodeJpeg] = {}

    def load(grayscale: bool) -> FakeDecodeJpeg:
        made["decoder"] = FakeDecodeJpeg(grayscale)
        return made["decoder"]

    monkeypatch.setattr(nvjpeg_module, "load_decode_jpeg", load)
    return made


def test_agrees_with_cpu_backend(fake: dict[str, FakeDecodeJpeg]) -> None:
    batch = [rgb_jpeg(300, 400, seed=s) for s in range(3)]
    for random_crop in (False, True):
        gpu_path = NvJpegDecoder(96, device="cpu", random_crop=random_crop or None, seed=3)
        cpu = create_decoder("cpu", size=96, random_crop=random_crop, seed=3)
        got, want = gpu_path(batch), cpu(batch)
        assert got.shape == want.shape == (3, 3, 96, 96)
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert (got.float() - want.float()).abs().mean() <= MEAN_TOLERANCE
    assert fake["decoder"].calls == [3]  # one batched call


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_chw_matches_the_cpu_rule(orientation: int) -> None:
    stored = np.random.default_rng(orientation).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    want = torch.from_numpy(orient(stored, orientation)).permute(2, 0, 1)
    got = orient_chw(torch.from_numpy(stored).permute(2, 0, 1), orientation)
    assert torch.equal(got, want)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_oriented_region_is_the_box_of_the_displayed_image(orientation: int) -> None:
    """The box is drawn on the displayed image, mapped back to the stored pixels, and only
    that region is turned: the same pixels as turning the whole image and cutting the box."""
    rng = np.random.default_rng(orientation)
    stored = torch.from_numpy(rng.integers(0, 256, (3, 9, 14), dtype=np.uint8))
    displayed = orient_chw(stored, orientation)
    shown_hw = (int(displayed.shape[1]), int(displayed.shape[2]))
    for _ in range(20):
        height, width = (int(rng.integers(1, side + 1)) for side in shown_hw)
        top = int(rng.integers(0, shown_hw[0] - height + 1))
        left = int(rng.integers(0, shown_hw[1] - width + 1))
        box = Box(top, left, height, width)
        want = displayed[:, top : top + height, left : left + width]
        assert torch.equal(oriented_region(stored, box, orientation), want), box
        inside = stored_box(box, orientation, (9, 14))
        assert 0 <= inside.top <= 9 - inside.height and 0 <= inside.left <= 14 - inside.width


@pytest.mark.parametrize("random_crop", [False, True])
def test_exif_rotated_jpegs_decode_like_the_cpu_backend(
    fake: dict[str, FakeDecodeJpeg], random_crop: bool
) -> None:
    """nvJPEG returns the stored pixels; the decoder turns them as displayed and cuts the
    crop boxes the cpu backend cuts, for every EXIF orientation."""
    batch = [exif_rotated_jpeg(120, 200, seed=o, orientation=o) for o in range(1, 9)]
    got = NvJpegDecoder((40, 24), device="cpu", random_crop=random_crop or None, seed=3)(batch)
    want = create_decoder("cpu", size=(40, 24), random_crop=random_crop, seed=3)(batch)
    assert fake["decoder"].calls == [8]  # decoded on the (stand-in) GPU path, no fallback
    assert got.shape == want.shape == (8, 3, 40, 24)
    for row in range(8):
        diff = (got[row].float() - want[row].float()).abs().mean()
        assert diff <= MEAN_TOLERANCE, f"orientation {row + 1}: mean abs diff {diff:.1f}"


def test_bad_image_does_not_sink_the_batch(
    fake: dict[str, FakeDecodeJpeg], images: dict[str, bytes]
) -> None:
    batch = [images[name] for name in (*GOOD, *BAD)]
    decoded = NvJpegDecoder(40, device="cpu", on_error="skip").decode(batch)
    assert decoded.kept.tolist() == list(range(len(GOOD)))
    # batch of JPEGs nvJPEG takes (color, large, gray, truncated) failed, retried one by one;
    # PNG, CMYK, corrupt and empty never reach it
    assert fake["decoder"].calls == [4, 1, 1, 1, 1]
    cpu = create_decoder("cpu", size=40)([images[name] for name in GOOD])
    assert (decoded.images.float() - cpu.float()).abs().mean() <= MEAN_TOLERANCE


@pytest.mark.parametrize("bad", BAD)
def test_on_error_raise_and_warn(
    fake: dict[str, FakeDecodeJpeg], images: dict[str, bytes], bad: str
) -> None:
    with pytest.raises(DecodeError, match="batch item 1"):
        NvJpegDecoder(16, device="cpu")([images["color"], images[bad]])
    with pytest.warns(RuntimeWarning, match="skipped a sample: "):
        kept = NvJpegDecoder(16, device="cpu", on_error="warn").decode([images[bad]]).kept
    assert kept.numel() == 0


def test_rows_decoded_apart_are_placed_with_a_device_index(
    fake: dict[str, FakeDecodeJpeg], images: dict[str, bytes], list_indices: list[str]
) -> None:
    # the PNG is decoded on the CPU; the nvJPEG rows around it go in by an index tensor
    batch = [images["color"], images["png"], images["large"], images["gray"]]
    got = NvJpegDecoder(24, device="cpu", seed=1, random_crop=True)(batch)
    want = create_decoder("cpu", size=24, seed=1, random_crop=True)(batch)
    assert list_indices == []
    assert (got.float() - want.float()).abs().mean() <= MEAN_TOLERANCE


def test_grayscale(fake: dict[str, FakeDecodeJpeg], images: dict[str, bytes]) -> None:
    out = NvJpegDecoder((20, 30), device="cpu", grayscale=True)([images["color"], images["gray"]])
    assert out.shape == (2, 1, 20, 30)


def test_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    with pytest.raises(ValueError, match="backend='nvjpeg' decodes on a CUDA device"):
        create_decoder("nvjpeg", size=32)


def test_missing_torchvision_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = nvjpeg_module.import_optional

    def no_torchvision(module: str, purpose: str) -> Any:
        return real_import("torchvision_is_not_here" if module == "torchvision.io" else module,
                           purpose)  # fmt: skip

    monkeypatch.setattr(nvjpeg_module, "import_optional", no_torchvision)
    with pytest.raises(ModuleNotFoundError, match="pip install"):
        NvJpegDecoder(32, device="cpu")


@pytest.mark.gpu
@pytest.mark.usefixtures("real_nvjpeg")
def test_real_nvjpeg_matches_cpu(images: dict[str, bytes]) -> None:
    batch = [rgb_jpeg(300, 400, seed=s) for s in range(4)] + [images[g] for g in GOOD]
    got = create_decoder("nvjpeg", size=(64, 80), seed=1, random_crop=True)(batch)
    want = create_decoder("cpu", size=(64, 80), seed=1, random_crop=True)(batch)
    assert got.device.type == "cuda" and got.shape == want.shape
    assert (got.cpu().float() - want.float()).abs().mean() <= MEAN_TOLERANCE


@pytest.mark.gpu
@pytest.mark.usefixtures("real_nvjpeg")
@pytest.mark.parametrize("random_crop", [False, True])
def test_real_nvjpeg_applies_exif_orientation_like_cpu(random_crop: bool) -> None:
    batch = [exif_rotated_jpeg(240, 320, seed=o, orientation=o) for o in range(1, 9)]
    got = create_decoder("nvjpeg", size=(64, 40), seed=4, random_crop=random_crop)(batch)
    want = create_decoder("cpu", size=(64, 40), seed=4, random_crop=random_crop)(batch)
    assert got.device.type == "cuda" and got.shape == want.shape == (8, 3, 64, 40)
    for row in range(8):
        diff = (got[row].cpu().float() - want[row].float()).abs().mean()
        assert diff <= MEAN_TOLERANCE, f"orientation {row + 1}: mean abs diff {diff:.1f}"


@pytest.mark.gpu
@pytest.mark.usefixtures("real_nvjpeg")
def test_real_nvjpeg_on_error_and_streams(images: dict[str, bytes]) -> None:
    # The damaged JPEG's header parses, so it reaches nvJPEG in the batch; neither nvJPEG
    # nor the CPU decoder can decode its entropy data.
    damaged = bogus_huffman_jpeg(images["color"])
    with pytest.raises(DecodeError):
        create_decoder("cpu", size=32)([damaged])
    decoder = create_decoder("nvjpeg", size=32, on_error="skip")
    batches: list[int] = []
    real = decoder._decode_jpeg  # type: ignore[attr-defined]

    def spy(data: Any, device: torch.device) -> Any:
        batches.append(len(data) if isinstance(data, list) else 1)
        return real(data, device)

    decoder._decode_jpeg = spy  # type: ignore[attr-defined]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fallback counts, tested apart
        decoded = decoder.decode([images["color"], damaged, images["large"]])
        total = decoded.images.float().sum()  # used on the caller's (side) stream at once
    torch.cuda.synchronize()
    assert batches[0] == 3  # all three went to nvJPEG in one batch
    kept = decoded.kept.tolist()
    if 1 not in kept:  # nvJPEG refused it: the batch was retried image by image, not raised
        assert kept == [0, 2] and batches[1:] == [1, 1, 1]
        assert decoder.fallbacks == {"batch_retry": 1, "cpu_decode": 1}
    assert float(total) == float(decoded.images.float().sum())
    want = create_decoder("cpu", size=32)([images["color"]])
    assert (decoded.images[:1].cpu().float() - want.float()).abs().mean() <= MEAN_TOLERANCE


def test_environment_errors_raise_instead_of_cpu_fallback(
    fake: dict[str, FakeDecodeJpeg], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = NvJpegDecoder(16, device="cpu", on_error="skip")
    for error in (
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB"),
        RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support"),
    ):

        def broken(data: Any, device: torch.device, error: Exception = error) -> Any:
            raise error

        monkeypatch.setattr(decoder, "_decode_jpeg", broken)
        with pytest.raises(type(error), match=str(error)[:20]):
            decoder.decode([rgb_jpeg(40, 40)])


def test_fallbacks_are_counted_and_warned_at_powers_of_ten(
    fake: dict[str, FakeDecodeJpeg], images: dict[str, bytes]
) -> None:
    # Per batch: the PNG goes to the CPU decoder, the truncated JPEG fails the batch (a
    # retry image by image) and then goes to the CPU decoder too.
    decoder = NvJpegDecoder(16, device="cpu", on_error="skip")
    with pytest.warns(RuntimeWarning, match="fallbacks so far") as record:
        for _ in range(12):
            decoder.decode([images["color"], images["truncated"], images["png"]])
    assert decoder.fallbacks == {"cpu_decode": 24, "batch_retry": 12}
    counts = [str(w.message).split("so far: ")[1].split(";")[0] for w in record]
    assert sorted(counts) == ["1", "1", "10", "10"]  # each kind at 1 and at 10


def test_count_fallback_warns_when_a_power_of_ten_is_reached(
    fake: dict[str, FakeDecodeJpeg],
) -> None:
    decoder = NvJpegDecoder(16, device="cpu")
    with pytest.warns(RuntimeWarning) as record:
        for count in (3, 6, 1, 90, 5, 1000):  # totals 3, 9, 10, 100, 105, 1105
            decoder.count_fallback("cpu_decode", "slow", count)
    assert [str(w.message).split("so far: ")[1].split(";")[0] for w in record] == [
        "3",
        "10",
        "100",
        "1105",
    ]


@pytest.mark.gpu
@pytest.mark.usefixtures("real_nvjpeg")
def test_real_nvjpeg_does_not_wait_for_queued_training_work() -> None:
    decoder = create_decoder("nvjpeg", size=32)
    batch = [rgb_jpeg(64, 64, seed=s) for s in range(4)]
    decoder(batch)  # warm-up: nvJPEG handles, allocator
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of queued "training" on the caller
    out = decoder(batch)
    # The host came back while the caller's queued work still runs: decoding overlapped it.
    assert not torch.cuda.current_stream().query()
    want = create_decoder("cpu", size=32)(batch)
    assert (out.cpu().float() - want.float()).abs().mean() <= MEAN_TOLERANCE
