"""Tiny encoded images for the decoder tests: colour, gray and CMYK JPEGs, a PNG, and bad
bytes (corrupt, truncated, empty)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.decode import cpu as cpu_module
from fastdata.decode import loader as loader_module


def smooth_rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    """``(H, W, 3)`` uint8: smooth gradients plus low-frequency blobs (JPEG-friendly)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        fy, fx, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.28)
        wave = np.sin(2 * np.pi * (fy * yy / height + fx * xx / width) + phase)
        channels.append(127.5 + 100 * wave)
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def encode(image: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def rgb_jpeg(height: int, width: int, seed: int = 0, quality: int = 95) -> bytes:
    return encode(Image.fromarray(smooth_rgb(height, width, seed)), quality=quality)


def exif_rotated_jpeg(height: int, width: int, seed: int = 0, *, orientation: int = 6) -> bytes:
    """A JPEG stored ``height x width`` with EXIF ``orientation`` (default 6: 'rotate 90
    clockwise to display'; 3: 180, 8: 90 counter-clockwise, 2/4/5/7: with a mirror)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(Image.fromarray(smooth_rgb(height, width, seed)), quality=95, exif=exif)


def damaged_jpeg(height: int = 64, width: int = 96, seed: int = 0, mode: str = "RGB") -> bytes:
    """A real JPEG whose entropy-coded data is damaged in the middle (bytes after the SOS
    segment flipped, no marker made or broken): libjpeg decodes it with a warning
    (``Corrupt JPEG data: ... extraneous bytes before marker 0xd9``), OpenCV returns an
    image. ``mode``: ``"RGB"`` or ``"CMYK"`` (a four-component JPEG)."""
    noisy = smooth_rgb(height, width, seed).astype(np.int16)
    noisy += np.random.default_rng(seed).integers(0, 40, noisy.shape, dtype=np.int16)
    pixels = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).convert(mode)
    data = bytearray(encode(pixels, quality=90))
    sos = data.index(b"\xff\xda")
    scan = sos + 2 + ((data[sos + 2] << 8) | data[sos + 3])  # the first entropy-coded byte
    middle = scan + (len(data) - scan) // 8
    for pos in range(middle, middle + 8):
        if 0xFF not in (data[pos - 1], data[pos]) and data[pos] ^ 0x5A != 0xFF:
            data[pos] ^= 0x5A
    return bytes(data)


@pytest.fixture(scope="session")
def images() -> dict[str, bytes]:
    """Named encoded images; ``good`` ones decode, ``bad`` ones do not."""
    rgb = smooth_rgb(120, 160, seed=1)
    color = rgb_jpeg(120, 160, seed=1)
    return {
        "color": color,
        "large": rgb_jpeg(480, 640, seed=2),
        "gray": encode(Image.fromarray(rgb[..., 0]), quality=95),
        "cmyk": encode(Image.fromarray(rgb).convert("CMYK"), quality=95),
        "png": encode(Image.fromarray(rgb), fmt="PNG"),
        "corrupt": b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4,
        "truncated": color[: len(color) // 4],
        "empty": b"",
    }


GOOD = ("color", "large", "gray", "cmyk", "png")
BAD = ("corrupt", "truncated", "empty")


@pytest.fixture
def list_indices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every Python-list index used on a tensor: on a CUDA tensor such an index is
    built on the host and copied synchronously (a host sync)."""
    seen: list[str] = []
    real_get, real_set = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def get(self: torch.Tensor, index: Any) -> Any:
        if isinstance(index, list):
            seen.append("get")
        return real_get(self, index)

    def set_(self: torch.Tensor, index: Any, value: Any) -> None:
        if isinstance(index, list):
            seen.append("set")
        real_set(self, index, value)

    monkeypatch.setattr(torch.Tensor, "__getitem__", get)
    monkeypatch.setattr(torch.Tensor, "__setitem__", set_)
    return seen


@pytest.fixture
def fake_cuda_uploads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], str]]:
    """The cpu decoder and DecodingLoader aimed at ``cuda:0`` without CUDA: the batch buffer
    is allocated plain where pinned memory is asked for (recorded as ``("pinned", ...)``),
    and each copy to the device is recorded ``(shape, device)`` instead of done (the
    tensors stay on the host; copies to the CPU are not recorded)."""
    uploads: list[tuple[tuple[int, ...], str]] = []

    def empty_batch(shape: tuple[int, ...], *, pinned: bool) -> torch.Tensor:
        uploads.append((shape, "pinned" if pinned else "pageable"))
        return torch.empty(shape, dtype=torch.uint8)

    def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            uploads.append((tuple(host.shape), str(device)))
        return host

    monkeypatch.setattr(cpu_module, "_empty_batch", empty_batch)
    monkeypatch.setattr(cpu_module, "copy_to_device", upload)
    monkeypatch.setattr(loader_module, "copy_to_device", upload)
    return uploads


@pytest.fixture
def real_nvjpeg() -> None:
    """Skip, with the reason, where torchvision >= 0.20 or its nvJPEG build is missing."""
    tv = pytest.importorskip(
        "torchvision",
        minversion="0.20",
        reason="the nvjpeg backend needs torchvision >= 0.20: pip install 'torch-fastdata[gpu]'",
    )
    data = torch.frombuffer(bytearray(rgb_jpeg(16, 16)), dtype=torch.uint8)
    try:
        tv.io.decode_jpeg([data], device="cuda")
    except RuntimeError as error:
        if "not compiled with nvjpeg" in str(error).lower():
            pytest.skip(f"this torchvision build has no nvJPEG: {error}")
        raise


def bogus_huffman_jpeg(data: bytes) -> bytes:
    """``data`` (a baseline JPEG) with its first Huffman table made invalid (code counts
    summing past 256): its header still parses (size, components), so a GPU decoder is
    handed it, but no decoder can decode its entropy-coded data."""
    at = data.index(b"\xff\xc4")  # DHT: marker, length (2), class/id (1), 16 code counts
    counts = at + 5
    return data[:counts] + b"\xff" * 16 + data[counts + 16 :]
