"""``max_pixels`` of every decoder backend and of ``RAMDataset``: images whose header claims
more pixels are refused before decoding (``on_error`` applies); ``0``/``None``: no limit."""

from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from torch.utils.data import DataLoader

from fastdata.datasets import RAMDataset
from fastdata.decode import Decoder, DecodingLoader, create_decoder
from fastdata.decode import nvjpeg as nvjpeg_module
from fastdata.decode.cpu import CpuDecoder
from fastdata.decode.nvjpeg import NvJpegDecoder
from fastdata.errors import DecodeError
from tests.decode.conftest import bogus_huffman_jpeg, rgb_jpeg, smooth_rgb
from tests.decode.test_nvjpeg import FakeDecodeJpeg


def _png(height: int, width: int) -> bytes:
    ok, data = cv2.imencode(".png", smooth_rgb(height, width))
    assert ok
    return data.tobytes()


def _png_header_only(height: int, width: int) -> bytes:
    """A PNG of a few dozen bytes whose IHDR claims ``height x width``."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))


def test_cpu_decoder_max_pixels_refuses_larger_images() -> None:
    jpeg, png = rgb_jpeg(30, 40), _png(20, 30)  # 1,200 and 600 pixels
    for limit, kept in ((1200, [0, 1]), (1199, [1]), (599, []), (0, [0, 1]), (None, [0, 1])):
        decoder = CpuDecoder(8, on_error="skip", max_pixels=limit)
        assert decoder.decode([jpeg, png]).kept.tolist() == kept, limit
        decoder.close()
    decoder = CpuDecoder(8, max_pixels=1000)
    with pytest.raises(DecodeError, match=r"40x30 = 1,200 pixels, over the limit of 1,000"):
        decoder([png, jpeg])
    decoder.close()


def test_cpu_decoder_default_limit_and_no_limit() -> None:
    bomb = _png_header_only(40000, 40000)
    default = CpuDecoder(8, on_error="skip")
    assert default.decode([bomb]).kept.tolist() == []
    assert "over the limit of 89,478,485" in str(default.last_errors[0])
    unlimited = CpuDecoder(8, on_error="skip", max_pixels=0)
    assert unlimited.decode([bomb]).kept.tolist() == []  # now OpenCV itself refuses it
    assert "over the limit" not in str(unlimited.last_errors[0])


@pytest.mark.parametrize("bad", [-1, True, 1.5, "100"])
def test_max_pixels_is_validated(bad: object, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_pixels must be a positive int"):
        CpuDecoder(8, max_pixels=bad)  # type: ignore[arg-type]
    path = tmp_path / "a.jpg"
    path.write_bytes(rgb_jpeg(8, 8))
    with pytest.raises(ValueError, match="max_pixels must be a positive int"):
        RAMDataset([path], None, max_pixels=bad, show_progress=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_pixels must be a positive int"):
        RAMDataset.from_arrays(np.zeros((1, 4, 4, 3), np.uint8), max_pixels=bad)


def test_decoding_in_workers_keeps_max_pixels() -> None:
    batches = [[rgb_jpeg(30, 40, seed=s), _png(20, 30)] for s in range(2)]
    loader = DataLoader(batches, batch_size=None, num_workers=1, collate_fn=lambda b: (b,))
    decoder = CpuDecoder(8, on_error="skip", max_pixels=1000)
    out = list(DecodingLoader(loader, decoder, last_batch="partial"))
    assert [len(images) for (images,) in out] == [1, 1]
    decoder.close()


def test_ram_dataset_max_pixels(tmp_path: Path) -> None:
    paths = []
    for name, data in (("a.jpg", rgb_jpeg(30, 40)), ("b.png", _png(20, 30))):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(data)
    limited = RAMDataset(paths, [0, 1], on_error="skip", max_pixels=1000, show_progress=False)
    images, labels = limited.__getitems__([0, 1])
    assert labels.tolist() == [1] and images.shape == (1, 3, 20, 30)
    for limit in (0, None, 1200):
        dataset = RAMDataset(paths, [0, 1], max_pixels=limit, show_progress=False)
        assert dataset[0][0].shape == (3, 30, 40), limit
    raising = RAMDataset(paths, [0, 1], max_pixels=1000, show_progress=False)
    with pytest.raises(DecodeError, match="over the limit of 1,000"):
        raising[0]
    # the default is PIL's limit
    (tmp_path / "bomb.png").write_bytes(_png_header_only(40000, 40000))
    default = RAMDataset([tmp_path / "bomb.png"], None, show_progress=False)
    with pytest.raises(DecodeError, match="over the limit of 89,478,485"):
        default[0]


# --- one limit for every backend, applied before the backend sees the batch ----------------


def _claiming(jpeg: bytes, height: int, width: int) -> bytes:
    """``jpeg`` with its frame header claiming ``height x width`` (a decompression bomb's
    header on a few hundred bytes of data)."""
    sof = jpeg.index(b"\xff\xc0")
    return jpeg[: sof + 5] + struct.pack(">HH", height, width) + jpeg[sof + 9 :]


def _backend(name: str, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Decoder:
    """A decoder of ``name`` that runs here: nvjpeg with an OpenCV stand-in for nvJPEG
    (recording the batch sizes it is handed in ``decoder.calls``), DALI on the CPU."""
    if name == "nvjpeg":
        fake = FakeDecodeJpeg(grayscale=False)
        monkeypatch.setattr(nvjpeg_module, "load_decode_jpeg", lambda grayscale: fake)
        decoder = NvJpegDecoder(8, device="cpu", **options)
        decoder.calls = fake.calls  # type: ignore[attr-defined]
        return decoder
    if name == "dali":
        pytest.importorskip("nvidia.dali")
    return create_decoder(name, size=8, device="cpu", **options)


BACKENDS = ["cpu", "nvjpeg", pytest.param("dali", marks=pytest.mark.dali)]


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_refuses_images_over_max_pixels(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    big, small, png = rgb_jpeg(30, 40), rgb_jpeg(20, 24, seed=1), _png(20, 30)  # 1,200, 480, 600
    decoder = _backend(name, monkeypatch, on_error="skip", max_pixels=1000)
    assert decoder.max_pixels == 1000
    assert decoder.decode([big, small, png, big]).kept.tolist() == [1, 2]
    if name == "nvjpeg":  # the refused images never reached nvJPEG
        assert decoder.calls == [1]  # type: ignore[attr-defined]
    with pytest.raises(
        DecodeError, match=r"40x30 = 1,200 pixels, over the limit of 1,000 .*: batch item 1"
    ):
        _backend(name, monkeypatch, max_pixels=1000).decode([small, big])
    with pytest.warns(RuntimeWarning, match=r"skipped a sample: .*over the limit of 1,000"):
        kept = _backend(name, monkeypatch, on_error="warn", max_pixels=1000).decode([big, small])
    assert kept.kept.tolist() == [1]
    for no_limit in (0, None):
        unlimited = _backend(name, monkeypatch, on_error="skip", max_pixels=no_limit)
        assert unlimited.max_pixels is None
        assert unlimited.decode([big, small, png]).kept.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="max_pixels must be a positive int"):
        _backend(name, monkeypatch, max_pixels=-1)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_bomb_header_is_refused_by_default_before_any_backend_decodes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = _claiming(rgb_jpeg(16, 16), 40000, 40000)
    decoder = _backend(name, monkeypatch, on_error="raise")
    with pytest.raises(DecodeError, match=r"over the limit of 89,478,485 .*: batch item 1") as info:
        decoder.decode([rgb_jpeg(16, 16), bomb])
    assert info.value.reason == "too_large"
    if name == "nvjpeg":
        assert decoder.calls == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", BACKENDS)
def test_decode_stream_maps_kept_back_past_refused_images(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DALI works a batch ahead in decode_stream: the refused images of each batch are
    taken out before, and ``kept`` indexes each whole batch after."""
    big = rgb_jpeg(30, 40)
    batches = [[rgb_jpeg(20, 24, seed=s) for s in range(3)] for _ in range(4)]
    batches[1][0] = batches[2][2] = big
    batches[3] = [big, big]
    decoder = _backend(name, monkeypatch, on_error="skip", max_pixels=1000)
    kept = [decoded.kept.tolist() for decoded in decoder.decode_stream(batches)]
    assert kept == [[0, 1, 2], [1, 2], [0, 1], []]
    whole = decoder.decode(batches[0]).images
    assert decoder.decode(batches[1]).images.shape[1:] == whole.shape[1:]


def test_create_decoder_passes_max_pixels_to_the_backend() -> None:
    decoder = create_decoder("cpu", size=8, on_error="skip", max_pixels=1000)
    assert isinstance(decoder, CpuDecoder) and decoder.max_pixels == 1000
    assert decoder.decode([rgb_jpeg(30, 40), rgb_jpeg(20, 24)]).kept.tolist() == [1]
    assert "max_pixels=1000" in repr(decoder)
    decoder.close()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvjpeg", pytest.param("dali", marks=pytest.mark.dali)])
def test_gpu_backends_refuse_a_bomb_header_without_allocating(name: str) -> None:
    pytest.importorskip("torchvision" if name == "nvjpeg" else "nvidia.dali")
    bomb = _claiming(rgb_jpeg(16, 16), 65000, 65000)  # 12.7 GB of pixels, were it decoded
    decoder = create_decoder(name, size=8, device="cuda", on_error="skip", max_pixels=1000)
    decoded = decoder.decode([bomb, rgb_jpeg(20, 24), rgb_jpeg(30, 40)])
    assert decoded.kept.tolist() == [1] and decoded.images.device.type == "cuda"
    default = create_decoder(name, size=8, device="cuda", on_error="skip")
    assert default.decode([bomb, rgb_jpeg(20, 24)]).kept.tolist() == [1]


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_names_images_by_the_sources_given(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names given for a batch reach each error path: images refused before decoding
    (over max_pixels) and images the backend (or its CPU fallback) cannot decode."""
    bomb = _claiming(rgb_jpeg(16, 16), 40000, 40000)
    # a JPEG header the GPU backends take, data that no decoder (nor the CPU fallback) can
    batch = [rgb_jpeg(16, 16), bomb, bogus_huffman_jpeg(rgb_jpeg(16, 16, seed=1))]
    names = ["dataset[7] (batch item 0)", "dataset[3] (batch item 1)", "dataset[12] (batch item 2)"]
    decoder = _backend(name, monkeypatch, on_error="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert decoder.decode(batch, sources=names).kept.tolist() == [0]
        stream = decoder.decode_stream([batch, batch[::-1]], sources=[names, None])
        assert [decoded.kept.tolist() for decoded in stream] == [[0], [2]]
    skipped = [str(w.message) for w in caught if str(w.message).startswith("skipped a sample")]
    assert sorted(message.rsplit(": ", 1)[1] for message in skipped) == sorted(
        [*names[1:], *names[1:], "batch item 0", "batch item 1"]
    )
    with pytest.raises(DecodeError, match=r"over the limit .*: dataset\[3\] \(batch item 1\)$"):
        _backend(name, monkeypatch).decode(batch, sources=names)
    with pytest.raises(ValueError, match="sources must name each of the 3 encoded images"):
        decoder.decode(batch, sources=names[:2])
    with pytest.raises(TypeError, match="sources must be a list of str"):
        decoder.decode(batch, sources="dataset[7]")
