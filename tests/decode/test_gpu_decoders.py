"""The decoders on a real CUDA device: no host synchronization in a decode, the caller's
stream ordered after the decoder's work, look-ahead decoding through ``DecodingLoader``,
flat memory, and nvJPEG against an exact area average. All `gpu`-marked."""

from __future__ import annotations

import gc
import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from fastdata.decode import DecodingLoader, create_decoder
from fastdata.decode import nvjpeg as nvjpeg_module
from fastdata.decode._batching import crop_resize_batch
from fastdata.decode._geometry import Box, center_box
from tests.decode.conftest import encode, rgb_jpeg, smooth_rgb
from tests.gpu.cuda_checks import host_syncs, spin

pytestmark = pytest.mark.gpu

MEAN_TOLERANCE = 3.0  # levels of 255, as in test_nvjpeg.py
# ~1 ms of GPU spin on a recent GPU
SPIN_CYCLES = 2_000_000


def photos(count: int, seed: int = 0) -> list[bytes]:
    """ImageNet-like JPEGs: 4:3 and 3:4 around 500x375, with texture."""
    sizes = [(375, 500), (500, 375), (333, 500), (480, 640), (400, 400)]
    out = []
    for i in range(count):
        rgb = smooth_rgb(*sizes[i % len(sizes)], seed=seed + i).astype(np.float32)
        rgb += np.random.default_rng(seed + i).normal(0, 10, rgb.shape)
        out.append(encode(Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)), quality=90))
    return out


def _settled_allocated() -> int:
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


@pytest.mark.usefixtures("real_nvjpeg")
@pytest.mark.parametrize("random_crop", [False, True])
def test_nvjpeg_decode_makes_no_host_sync(random_crop: bool) -> None:
    # a Python list as an index on a CUDA tensor syncs: once per crop size (per image with
    # random crops) before the resize used device index tensors
    batch = photos(64, seed=100)
    decoder = create_decoder("nvjpeg", size=224, seed=0, random_crop=random_crop)
    decoder(batch)  # warm-up: nvJPEG handles, allocator
    assert host_syncs(lambda: decoder(batch)) == 0


@pytest.mark.usefixtures("real_nvjpeg")
def test_nvjpeg_with_cpu_fallbacks_makes_no_host_sync() -> None:
    png = encode(Image.fromarray(smooth_rgb(120, 160, seed=1)), fmt="PNG")
    batch = [*photos(6), png, *photos(3, seed=50)]
    decoder = create_decoder("nvjpeg", size=64, seed=0, random_crop=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the PNG's fallback, counted
        decoder(batch)
        assert host_syncs(lambda: decoder(batch)) == 0
    assert decoder.fallbacks == {"cpu_decode": 2}


def test_cpu_decoder_to_cuda_makes_no_host_sync() -> None:
    # a pageable .to("cuda") waits for all work queued on the current stream
    batch = [rgb_jpeg(150, 200, seed=s) for s in range(6)]
    decoder = create_decoder("cpu", size=48, device="cuda")
    want = create_decoder("cpu", size=48)(batch)
    decoder(batch)
    assert host_syncs(lambda: decoder(batch)) == 0
    assert torch.equal(decoder(batch).cpu(), want)


def test_decoding_loader_to_cuda_makes_no_host_sync() -> None:
    # a skipped sample (labels indexed), a padded batch (images indexed on the device)
    good = [rgb_jpeg(120, 160, seed=s) for s in range(5)]
    batches = [([*good[:3], b"not an image"], torch.arange(4)), (good[3:], torch.arange(2))]
    decoder = create_decoder("cpu", size=32, device="cuda", on_error="skip")
    loader = DecodingLoader(batches, decoder, last_batch="pad", batch_size=4)
    list(loader)
    out: list[tuple[torch.Tensor, ...]] = []
    assert host_syncs(lambda: out.extend(loader)) == 0
    assert [labels.tolist() for _, labels in out] == [[0, 1, 2, 0], [0, 1, 0, 1]]
    assert all(images.device.type == "cuda" for images, _ in out)


@pytest.mark.usefixtures("real_nvjpeg")
def test_nvjpeg_centre_crops_match_an_exact_area_average() -> None:
    batch = [rgb_jpeg(300 + 8 * i, 400 - 4 * i, seed=i) for i in range(8)]
    got = create_decoder("nvjpeg", size=(64, 80))(batch).cpu()
    for row, data in enumerate(batch):
        full = Image.open(io.BytesIO(data)).convert("RGB")
        top, left, height, width = center_box((full.height, full.width), (64, 80))
        area = full.resize(
            (80, 64), Image.Resampling.BOX, box=(left, top, left + width, top + height)
        )
        want = torch.from_numpy(np.asarray(area).copy()).permute(2, 0, 1)
        diff = (got[row].float() - want.float()).abs().mean()
        assert diff <= 2.5, f"row {row}: mean abs diff {diff:.2f} from an exact area average"


@pytest.mark.usefixtures("real_nvjpeg")
def test_caller_waits_for_a_late_batch_through_the_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The resize writes each batch ~20 ms late on the decoder's side stream (decoded a
    # batch ahead, on a thread); the consumer, on its own stream, reads at once: right
    # values only if its stream waits for that batch's event.
    batches = [[rgb_jpeg(160 + 8 * b, 200, seed=10 * b + s) for s in range(6)] for b in range(5)]
    reference = create_decoder("nvjpeg", size=40, seed=3, random_crop=True)
    want = [reference(b).cpu() for b in batches]
    real = nvjpeg_module.crop_resize_batch

    def late(images: list[torch.Tensor], boxes: list[Box], out: torch.Tensor) -> None:
        scratch = torch.empty_like(out)
        real(images, boxes, scratch)
        spin(20 * SPIN_CYCLES)
        out.copy_(scratch)

    monkeypatch.setattr(nvjpeg_module, "crop_resize_batch", late)
    decoder = create_decoder("nvjpeg", size=40, seed=3, random_crop=True)
    loader = DecodingLoader([(b, torch.arange(6)) for b in batches], decoder)
    consumer = torch.cuda.Stream()
    seen = []
    with torch.cuda.stream(consumer):
        for images, _labels in loader:
            seen.append(images.clone())  # read at once on the consumer's stream
            spin(5 * SPIN_CYCLES)  # and again later: the memory must not be reused
            seen.append(images.clone())
    torch.cuda.synchronize()
    for i, w in enumerate(want):
        assert torch.equal(seen[2 * i].cpu(), w), f"batch {i} read before it was written"
        assert torch.equal(seen[2 * i + 1].cpu(), w), f"batch {i} overwritten while in use"


@pytest.mark.usefixtures("real_nvjpeg")
def test_nvjpeg_memory_is_flat_across_batches() -> None:
    decoder = create_decoder("nvjpeg", size=224, seed=0, random_crop=True)
    batch = photos(16, seed=200)
    for _ in range(3):
        decoder(batch)
    first = _settled_allocated()
    for _ in range(10):
        decoder(batch)
    assert _settled_allocated() <= first


def test_decoding_in_workers_then_to_cuda_matches_the_main_process() -> None:
    samples = [(rgb_jpeg(120, 160, seed=s), s) for s in range(24)]
    loader = DataLoader(samples, batch_size=8, num_workers=2, pin_memory=True)
    decoding = DecodingLoader(loader, create_decoder("cpu", size=40, device="cuda"))
    assert decoding.decodes_in_workers
    reference = create_decoder("cpu", size=40)
    for i, (images, labels) in enumerate(decoding):
        encoded = [data for data, _ in samples[8 * i : 8 * i + 8]]
        assert images.device.type == "cuda" and labels.device.type == "cuda"
        assert torch.equal(images.cpu(), reference(encoded)), f"batch {i}"
        assert labels.cpu().tolist() == list(range(8 * i, 8 * i + 8))


def test_batched_resize_on_cuda_matches_the_cpu_result() -> None:
    # the same matmuls on both devices (float32; TF32 off, PyTorch's default): at most a
    # level apart where a value sits on a rounding boundary
    rng = np.random.default_rng(7)
    sizes = [(375, 500), (500, 375), (333, 500), (480, 640), (60, 50)]
    images = [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)) for h, w in sizes]
    boxes = [Box(10, 20, 300, 400), Box(0, 0, 500, 375), Box(5, 7, 200, 123), Box(1, 2, 479, 600),
             Box(3, 4, 40, 30)]  # fmt: skip
    want = torch.empty((5, 3, 224, 224), dtype=torch.uint8)
    crop_resize_batch(images, boxes, want)
    got = torch.empty((5, 3, 224, 224), dtype=torch.uint8, device="cuda")
    crop_resize_batch([image.cuda() for image in images], boxes, got)
    diff = (got.cpu().float() - want.float()).abs()
    assert diff.max() <= 1 and diff.mean() <= 0.01
