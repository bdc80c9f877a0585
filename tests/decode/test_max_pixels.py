"""``max_pixels`` of the cpu decoder and of ``RAMDataset``: images whose header claims more
pixels are refused before decoding (``on_error`` applies); ``0``/``None``: no limit."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from torch.utils.data import DataLoader

from fastdata.datasets import RAMDataset
from fastdata.decode import DecodingLoader
from fastdata.decode.cpu import CpuDecoder
from fastdata.errors import DecodeError
from tests.decode.conftest import rgb_jpeg, smooth_rgb


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
