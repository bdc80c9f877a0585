"""Tiny encoded images for the decoder tests: colour, gray and CMYK JPEGs, a PNG, and bad
bytes (corrupt, truncated, empty)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image


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
