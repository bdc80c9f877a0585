"""Image decoding, shared by preprocessing, datasets and the ``cpu`` decoder backend.

JPEGs go through simplejpeg (libjpeg-turbo's TurboJPEG API, no colour conversion pass):
it decodes the sample photographs 13-25% faster than ``cv2.imdecode`` here, to the same
bytes (both are libjpeg-turbo with its default IDCT and upsampling). Everything else goes
through OpenCV: other formats, CMYK/YCCK JPEGs, JPEGs whose EXIF orientation must be applied,
and JPEGs that simplejpeg rejects (truncated data, for instance, which OpenCV decodes as
far as it can, as it always has here).

For JPEGs that are at least twice the wanted size, libjpeg-turbo can decode at 1/2, 1/4 or
1/8 scale straight from the DCT coefficients, which costs a fraction of a full decode.
:func:`decode_image` picks the largest reduction that keeps the decoded image at least as
large as asked.
"""

from __future__ import annotations

from typing import NamedTuple

import cv2
import numpy as np
import simplejpeg

from fastdata.errors import DecodeError

_REDUCED_COLOR = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
                  4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}  # fmt: skip
# OpenCV >= 4.10 can have libjpeg write RGB directly, which saves a colour-conversion pass.
_COLOR_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)
if _COLOR_RGB is not None:
    _REDUCED_COLOR = {
        f: (flag & ~cv2.IMREAD_COLOR) | _COLOR_RGB for f, flag in _REDUCED_COLOR.items()
    }
_REDUCED_GRAY = {1: cv2.IMREAD_GRAYSCALE, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
                 4: cv2.IMREAD_REDUCED_GRAYSCALE_4, 8: cv2.IMREAD_REDUCED_GRAYSCALE_8}  # fmt: skip
# Start-of-frame markers (baseline, extended, progressive, lossless...) carry the size.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


_APP1 = 0xE1
_EXIF_ID = b"Exif\x00\x00"


class JpegHeader(NamedTuple):
    """What a JPEG's markers before its first frame say."""

    height: int
    width: int
    components: int  # 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK
    exif: bool  # an EXIF segment is present (it may carry an orientation)


def jpeg_header(data: bytes | np.ndarray) -> JpegHeader | None:
    """The frame header of a JPEG, or ``None`` if it is not a JPEG or the header is
    unreadable. Reads only the markers before the first frame."""
    buf = np.ascontiguousarray(data, dtype=np.uint8).data if isinstance(data, np.ndarray) else data
    if len(buf) < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        return None
    pos = 2
    end = len(buf)
    exif = False
    while pos + 9 < end:
        if buf[pos] != 0xFF:
            return None
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = (buf[pos + 2] << 8) | buf[pos + 3]
        if marker in _SOF_MARKERS:
            height = (buf[pos + 5] << 8) | buf[pos + 6]
            width = (buf[pos + 7] << 8) | buf[pos + 8]
            if not (height and width):
                return None
            return JpegHeader(height, width, buf[pos + 9], exif)
        if marker == _APP1 and bytes(buf[pos + 4 : pos + 10]) == _EXIF_ID:
            exif = True
        pos += 2 + length
    return None


def jpeg_size(data: bytes | np.ndarray) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG's frame header, or ``None`` if it is not a JPEG
    (or the header is unreadable). Reads only the markers before the first frame."""
    header = jpeg_header(data)
    return None if header is None else (header[0], header[1])


def reduction_for(source_hw: tuple[int, int] | None, min_side: int | None) -> int:
    """Largest factor in (1, 2, 4, 8) that keeps the shorter side of ``source_hw`` at
    least ``min_side`` once decoded at that scale (1 when either is unknown)."""
    if source_hw is None or not min_side:
        return 1
    shorter = min(source_hw)
    factor = 1
    for candidate in (2, 4, 8):
        # libjpeg rounds the scaled size up: ceil(side / factor)
        if -(-shorter // candidate) >= min_side:
            factor = candidate
    return factor


def decode_image(
    data: bytes | np.ndarray,
    *,
    min_side: int | None = None,
    grayscale: bool = False,
    exif_orientation: bool = True,
    source: str = "<bytes>",
) -> np.ndarray:
    """Decode an encoded image (JPEG, PNG, BMP, WebP, TIFF…) to uint8 pixels.

    Args:
        data: The encoded bytes.
        min_side: When given, JPEGs are decoded at the smallest 1/2, 1/4 or 1/8 scale
            whose shorter side is still at least this many pixels (other formats decode
            at full size). The caller resizes to the exact target afterwards.
        grayscale: Decode to one channel.
        exif_orientation: Rotate/flip as the EXIF orientation tag says (OpenCV's default).
            ``False`` keeps the stored orientation, like PIL, torchvision and DALI do by
            default, and keeps the pixels aligned with the frame header's size.
        source: Where the bytes came from, for the error message.

    Returns:
        ``(H, W, 3)`` uint8 RGB, or ``(H, W)`` uint8 when ``grayscale``.

    Raises:
        DecodeError: The bytes are not a decodable image (corrupt, truncated, empty).
    """
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    header = jpeg_header(buf)
    factor = reduction_for(None if header is None else (header.height, header.width), min_side)
    return decode_reduced(
        buf,
        header,
        factor,
        grayscale=grayscale,
        exif_orientation=exif_orientation,
        source=source,
    )


def decode_reduced(
    buf: np.ndarray,
    header: JpegHeader | None,
    factor: int,
    *,
    grayscale: bool,
    exif_orientation: bool,
    source: str,
) -> np.ndarray:
    """:func:`decode_image` for callers that already parsed the header (``None``: not a
    JPEG) and chose the reduction ``factor`` (1, 2, 4 or 8; JPEGs only)."""
    if buf.size == 0:
        raise DecodeError("empty image data", source)
    if header is not None and header.components != 4 and not (exif_orientation and header.exif):
        fast = _decode_simplejpeg(buf, header, factor, grayscale)
        if fast is not None:
            return fast
    flag = (_REDUCED_GRAY if grayscale else _REDUCED_COLOR)[factor]
    if not exif_orientation:
        flag |= cv2.IMREAD_IGNORE_ORIENTATION
    image = cv2.imdecode(buf, flag)
    if image is None:
        raise DecodeError("not a decodable image (corrupt, truncated or unknown format)", source)
    if not grayscale and _COLOR_RGB is None:
        cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=image)
    return image


def _decode_simplejpeg(
    buf: np.ndarray, header: JpegHeader, factor: int, grayscale: bool
) -> np.ndarray | None:
    """The JPEG at ``1/factor`` scale, or ``None`` when simplejpeg rejects it (then OpenCV
    decides, as it always has here: it decodes truncated data as far as it goes)."""
    try:
        image = simplejpeg.decode_jpeg(
            buf,
            colorspace="GRAY" if grayscale else "RGB",
            # the smallest libjpeg scale that is at least 1/factor is 1/factor itself
            min_height=-(-header.height // factor),
            min_width=-(-header.width // factor),
        )
    except ValueError:
        return None
    return image[:, :, 0] if grayscale else image
