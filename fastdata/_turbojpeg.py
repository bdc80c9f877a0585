"""JPEG decoding through simplejpeg (libjpeg-turbo's TurboJPEG API), and what its warnings
mean for a sample.

libjpeg reports damaged data as a *warning* and decodes on: the pixels after the damage
are made up (grey blocks, shifted colours), and OpenCV prints the warning on stderr and
returns the image. fastdata decodes strictly and judges each warning:

- data that ends early (``Premature end of JPEG file``: a truncated file, or a frame header
  claiming more pixels than the data holds) is an error whatever the caller's policy: the
  rest of the image would be invented;
- any other warning about the image data (``Corrupt JPEG data: ...``, bad Huffman codes,
  bytes left over in the entropy-coded data) means the image is damaged: an error, unless
  the caller keeps damaged images (``on_error="warn"``: kept, and reported as kept);
- stray bytes between the markers *before* the scan (common in camera files) and a few
  warnings that say nothing about the pixels (an unknown JFIF revision, non-standard scan
  parameters of a sequential file) are harmless: the image is returned.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import simplejpeg

from fastdata.errors import DecodeError

_TRUNCATED = "Premature end of JPEG file"
_CORRUPT = "Corrupt JPEG data"
_STRAY = "extraneous bytes before marker"
_MARKER = re.compile(r"before marker 0x([0-9a-fA-F]{2})")
# libjpeg warnings that say nothing about the pixels.
_HARMLESS = ("unknown JFIF revision number", "Invalid SOS parameters for sequential JPEG")
# Markers that only follow entropy-coded data: bytes left before them are damaged data.
_AFTER_SCAN_MARKERS = frozenset({0xD9, *range(0xD0, 0xD8)})  # EOI, RST0-RST7
_SOS = 0xDA
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})  # no length field


class JpegPlan(NamedTuple):
    """How to decode one JPEG with simplejpeg."""

    min_height: int
    min_width: int
    colorspace: str  # "RGB", "GRAY", or "CMYK" (to check a CMYK file OpenCV then decodes)


def decode_turbo(
    buf: np.ndarray, plan: JpegPlan, source: str, damaged: list[DecodeError] | None
) -> np.ndarray | None:
    """Decode strictly; ``None`` when simplejpeg cannot decode the file at all (then OpenCV
    decides).

    Args:
        buf: The JPEG bytes.
        plan: The smallest size wanted (a reduced decode) and the colour space.
        source: Where the bytes came from, for the error.
        damaged: Where to note a damaged image that is kept (see the module docs), or
            ``None`` to refuse damaged images.

    Returns:
        ``(H, W, C)`` uint8 in ``plan.colorspace`` (``C`` = 3, 1 or 4), or ``None``.

    Raises:
        DecodeError: The data is truncated, or damaged and ``damaged`` is ``None``.
    """
    options = {
        "colorspace": plan.colorspace,
        "min_height": plan.min_height,
        "min_width": plan.min_width,
    }
    try:
        return simplejpeg.decode_jpeg(buf, **options)
    except ValueError as exc:
        warning = str(exc)
        if _TRUNCATED in warning:
            raise DecodeError(f"corrupt or truncated JPEG ({exc})", source, "truncated") from exc
        image: np.ndarray | None
        try:  # a warning decodes leniently; an error (an unsupported file) does not
            image = simplejpeg.decode_jpeg(buf, strict=False, **options)
        except ValueError:
            image = None
        harmless = _harmless(warning, buf)
        if image is None:  # not decodable by simplejpeg even leniently (stray header bytes)
            if warning.startswith(_CORRUPT) and not harmless:
                raise DecodeError(f"corrupt or truncated JPEG ({exc})", source) from exc
            return None  # OpenCV decides
        if harmless:
            return image
        error = DecodeError(f"corrupt or truncated JPEG ({exc})", source, kept=damaged is not None)
        if damaged is None:
            raise error from exc
        damaged.append(error)
        return image


def _harmless(warning: str, buf: np.ndarray) -> bool:
    """Whether a libjpeg warning leaves the pixels as encoded (see the module docs)."""
    if any(text in warning for text in _HARMLESS):
        return True
    if _STRAY not in warning:
        return False
    named = _MARKER.search(warning)
    marker = int(named.group(1), 16) if named else -1
    return marker not in _AFTER_SCAN_MARKERS and _stray_bytes_before_scan(buf)


def _stray_bytes_before_scan(buf: np.ndarray) -> bool:
    """Whether bytes that are not a marker sit between the markers before the first scan
    (after which libjpeg's stray-bytes warning may be about them, not about the scan)."""
    pos, end = 2, len(buf)
    while pos + 4 <= end:
        if buf[pos] != 0xFF:
            return True
        marker = int(buf[pos + 1])
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker == _SOS:
            return False
        elif marker in _STANDALONE_MARKERS:
            pos += 2
        else:
            pos += 2 + ((int(buf[pos + 2]) << 8) | int(buf[pos + 3]))
    return False
