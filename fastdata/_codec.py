"""Image decoding, shared by preprocessing, datasets and the ``cpu`` decoder backend.

JPEGs go through simplejpeg (libjpeg-turbo's TurboJPEG API): it decodes straight to RGB,
without ``cv2.imdecode``'s separate BGR-to-RGB pass, to the same bytes (both are
libjpeg-turbo with its default IDCT and upsampling). Everything else goes through OpenCV:
other formats, CMYK/YCCK JPEGs (checked by simplejpeg first), and JPEGs that simplejpeg
rejects. A JPEG whose data libjpeg warns about is judged by one rule
(:mod:`fastdata._turbojpeg`): an error, or kept and reported when the caller asks
(``damaged=``, the ``on_error="warn"`` policy).

EXIF orientation: one rule everywhere (preprocessing, ``RAMDataset`` and every decoder
backend: ``cpu``, ``dali``, ``nvjpeg``): a JPEG's orientation tag is applied, so pixels come
out as the photo is displayed (OpenCV's and ``PIL.ImageOps.exif_transpose``'s rule).
:func:`orient` applies the same flip/rotation to other arrays (a segmentation mask).

Bit depth: pixels are 8 bits. A 16-bit image (PNG, TIFF; PIL modes ``I;16``...) keeps its
high byte (``value >> 8``), OpenCV's rule for such files, whether it is decoded from a file
or handed over as a PIL image (:func:`pil_pixels`). 32-bit integer and floating-point images
(PIL modes ``I`` and ``F``) have no one 8-bit reading (their range is the producer's
choice) and are refused, naming the mode, on every path.

Limits: an image whose header claims more than ``max_pixels`` pixels (default
:data:`DEFAULT_MAX_PIXELS`, PIL's limit) is refused before any pixel is decoded, and a JPEG
whose data ends before its frame is complete (a corrupt or lying frame header) is an
error under every policy, not a grey image. Any exception a decoding library raises on the
bytes becomes a :class:`DecodeError`, so callers apply their ``on_error`` policy;
``MemoryError`` is not converted.

For JPEGs that are at least twice the wanted size, libjpeg-turbo can decode at 1/2, 1/4 or
1/8 scale straight from the DCT coefficients, which costs a fraction of a full decode.
:func:`decode_image` picks the largest reduction that keeps the decoded image at least as
large as asked (:func:`reduction_factors`, the one rule decoders use too).
"""

from __future__ import annotations

import io
import struct
import warnings
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image

from fastdata._turbojpeg import JpegPlan, decode_turbo
from fastdata.errors import DecodeError, DecodeReason

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
_ORIENTATION_TAG = 0x0112
# PIL's Image.MAX_IMAGE_PIXELS (a 1 GiB RGBA image): above it PIL warns of a decompression
# bomb. An 89.5-megapixel RGB image is 268 MB decoded.
DEFAULT_MAX_PIXELS = 89_478_485
# Start and end of the formats fastdata stores (JPEG, PNG): bytes that start so and do not
# decode are damaged (truncated when the end is missing), not of an unknown kind.
_FORMAT_ENDS = {b"\xff\xd8": b"\xff\xd9", b"\x89PNG\r\n\x1a\n": b"IEND\xaeB`\x82"}


# PIL modes of 16-bit pixels (native, little- and big-endian), and of wider ones.
_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
_WIDE_MODES = {"I": "32-bit integer", "F": "32-bit floating-point"}


def wide_mode_message(mode: str) -> str:
    """Why an image of PIL mode ``I`` or ``F`` is refused, and what to do instead."""
    return (
        f"PIL mode {mode} ({_WIDE_MODES[mode]} pixels) has no one 8-bit reading: scale the "
        "image to uint8 (or to 16 bits, PIL mode I;16) first"
    )


def pil_pixels(image: Image.Image) -> np.ndarray:
    """The uint8 pixels of a PIL image, by the rule files are decoded with.

    ``L`` and ``RGB`` as they are; ``1`` as ``L``; 16-bit modes (``I;16``, ``I;16B``...)
    as ``L`` keeping the high byte (``value >> 8``, as OpenCV reads a 16-bit PNG or TIFF);
    every other mode converted to ``RGB`` as torchvision's loader does (``P``, ``RGBA``,
    ``CMYK``...).

    Returns:
        ``(H, W)`` uint8 for one channel, ``(H, W, 3)`` uint8 RGB otherwise.

    Raises:
        ValueError: The mode is ``I`` or ``F`` (no 8-bit rule), or PIL cannot convert it
            to RGB (the message names the mode).
    """
    mode = image.mode
    if mode in ("L", "RGB"):
        return np.asarray(image)
    if mode in _SIXTEEN_BIT_MODES:
        return (np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8)
    if mode in _WIDE_MODES:
        raise ValueError(wide_mode_message(mode))
    try:
        return np.asarray(image.convert("L" if mode == "1" else "RGB"))
    except ValueError as exc:  # a mode PIL cannot convert (OSError: a corrupt file)
        raise ValueError(
            f"PIL cannot convert mode {mode} to RGB ({exc}): convert the image to RGB or L first"
        ) from exc


def _wide_mode(buf: np.ndarray) -> str | None:
    """``I`` or ``F`` when PIL reads ``buf`` as an image of that mode (OpenCV cannot)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(buf.tobytes())) as pil:
                return pil.mode if pil.mode in _WIDE_MODES else None
    except Exception:  # not an image PIL knows either
        return None


class JpegHeader(NamedTuple):
    """What a JPEG's markers before its first frame say."""

    height: int
    width: int
    components: int  # 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK
    exif: bool  # an EXIF segment is present (it may carry an orientation)
    orientation: int = 1  # the EXIF orientation tag, 1-8 (1: as stored)

    @property
    def oriented_hw(self) -> tuple[int, int]:
        """``(height, width)`` once the EXIF orientation is applied (5-8 swap the axes)."""
        return (self.width, self.height) if self.orientation >= 5 else (self.height, self.width)


def _exif_orientation(segment: bytes) -> int:
    """The orientation tag of an EXIF segment (TIFF data after ``Exif\0\0``); 1 if absent."""
    if len(segment) < 8 or segment[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if segment[:2] == b"II" else ">"
    try:
        (ifd,) = struct.unpack_from(f"{order}I", segment, 4)
        (count,) = struct.unpack_from(f"{order}H", segment, ifd)
        for entry in range(min(count, 512)):
            tag, kind, _, value = struct.unpack_from(f"{order}HHII", segment, ifd + 2 + 12 * entry)
            if tag == _ORIENTATION_TAG:
                if kind == 3:  # SHORT: the value sits in the first two bytes of the field
                    (value,) = struct.unpack_from(f"{order}H", segment, ifd + 2 + 12 * entry + 8)
                return value if 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1


def jpeg_header(data: bytes | np.ndarray) -> JpegHeader | None:
    """The frame header of a JPEG, or ``None`` if it is not a JPEG or the header is
    unreadable. Reads only the markers before the first frame."""
    buf = np.ascontiguousarray(data, dtype=np.uint8).data if isinstance(data, np.ndarray) else data
    if len(buf) < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        return None
    pos = 2
    end = len(buf)
    exif = False
    orientation = 1
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
            return JpegHeader(height, width, buf[pos + 9], exif, orientation)
        if marker == _APP1 and not exif and bytes(buf[pos + 4 : pos + 10]) == _EXIF_ID:
            exif = True
            orientation = _exif_orientation(bytes(buf[pos + 10 : pos + 2 + length]))
        pos += 2 + length
    return None


def jpeg_size(data: bytes | np.ndarray) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG's frame header, or ``None`` if it is not a JPEG
    (or the header is unreadable). Reads only the markers before the first frame."""
    header = jpeg_header(data)
    return None if header is None else (header[0], header[1])


def image_size(data: bytes | np.ndarray) -> tuple[int, int] | None:
    """``(height, width)`` as stored, read from the header only (JPEG, PNG; other formats
    through PIL's header parser), or ``None`` when the header gives no size.

    Raises:
        DecodeError: PIL refuses the header as a decompression bomb.
    """
    header = jpeg_header(data)
    if header is not None:
        return header.height, header.width
    raw = bytes(data[:24]) if isinstance(data, bytes) else data[:24].tobytes()
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR":
        width, height = struct.unpack(">II", raw[16:24])
        return height, width
    if raw[:2] == b"\xff\xd8":  # a JPEG whose frame header is missing or unreadable
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stream = io.BytesIO(data if isinstance(data, bytes) else data.tobytes())
            with Image.open(stream) as pil:
                width, height = pil.size
    except Image.DecompressionBombError as exc:
        raise DecodeError(f"image too large ({exc})", "<bytes>", "too_large") from exc
    except Exception:  # not a format PIL knows: the decoder decides
        return None
    return height, width


def check_pixels(hw: tuple[int, int] | None, max_pixels: int | None, source: str) -> None:
    """Refuse an image whose header claims more than ``max_pixels`` pixels (``None``: no
    limit), before any memory is spent decoding it.

    Raises:
        DecodeError: Naming the size, the limit and how to raise it.
    """
    if hw is None or max_pixels is None:
        return
    if hw[0] * hw[1] > max_pixels:
        raise DecodeError(
            f"image header says {hw[1]}x{hw[0]} = {hw[0] * hw[1]:,} pixels, over the limit of "
            f"{max_pixels:,} (max_pixels; raise it to accept such images)",
            source,
            "too_large",
        )


def resolve_max_pixels(max_pixels: int | None) -> int | None:
    """A user's ``max_pixels``: the limit, or ``None`` for no limit (given as 0 or ``None``).

    Raises:
        ValueError: ``max_pixels`` is not a non-negative int or ``None``.
    """
    if max_pixels is None or (
        isinstance(max_pixels, int) and not isinstance(max_pixels, bool) and max_pixels == 0
    ):
        return None
    if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 0:
        raise ValueError(
            f"max_pixels must be a positive int (pixels, width x height), or 0 or None for "
            f"no limit, got {max_pixels!r}"
        )
    return max_pixels


# The largest output side of preprocessing: JPEG's (its header holds 16-bit sides), far
# above any training resolution; a raw RGB image of that side is 12.9 GB.
MAX_OUTPUT_SIDE = 65_535


def output_size_problem(
    sizes: tuple[int, ...], max_pixels: int | None, limit_name: str = "max_pixels"
) -> str:
    """Why no input could be stored at these output sides, or ``""``: a side over
    :data:`MAX_OUTPUT_SIDE`, or an output of more pixels than ``max_pixels`` (the limit every
    input is held to, so an output over it is refused before any work, not per input).
    ``limit_name`` is how the message names the limit (``--max-pixels`` on the CLI)."""
    largest = max(sizes)
    if largest > MAX_OUTPUT_SIDE:
        return f"an output side of {largest:,} pixels is over the largest, {MAX_OUTPUT_SIDE:,}"
    if max_pixels is not None and largest * largest > max_pixels:
        return (
            f"an output of {largest}x{largest} = {largest * largest:,} pixels is over the "
            f"pixel limit that every image is held to, {limit_name} {max_pixels:,}: use a "
            "smaller size, or raise the limit (0: none)"
        )
    return ""


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """Apply an EXIF orientation (1-8) to ``(H, W[, C])`` pixels: the flip or rotation that
    shows the image as displayed (the same as OpenCV and ``PIL.ImageOps.exif_transpose``).
    Returns a C-contiguous array (``image`` itself for orientation 1)."""
    if orientation == 2:
        out = image[:, ::-1]
    elif orientation == 3:
        out = image[::-1, ::-1]
    elif orientation == 4:
        out = image[::-1]
    elif orientation == 5:
        out = image.swapaxes(0, 1)
    elif orientation == 6:
        out = image.swapaxes(0, 1)[:, ::-1]
    elif orientation == 7:
        out = image[::-1, ::-1].swapaxes(0, 1)
    elif orientation == 8:
        out = image.swapaxes(0, 1)[::-1]
    else:
        return image
    return np.ascontiguousarray(out)


# libjpeg-turbo decodes straight from the DCT coefficients at these scale denominators.
JPEG_REDUCTIONS = (1, 2, 4, 8)


def reduction_factors(extents_hw: np.ndarray, need_hw: tuple[int, int]) -> np.ndarray:
    """The one reduced-decoding rule: per region, the largest denominator ``f`` in
    :data:`JPEG_REDUCTIONS` whose 1/f scale still leaves the region at least ``need_hw``
    pixels (``height / f >= need_height`` and ``width / f >= need_width``), so the resize
    that follows never enlarges.

    Args:
        extents_hw: ``(B, 2)`` region (a crop box, or the whole image) heights and widths
            in full-resolution pixels.
        need_hw: The pixels the caller needs from each region, ``(height, width)``.

    Returns:
        ``(B,)`` int64 denominators.
    """
    extents = np.asarray(extents_hw, dtype=np.int64).reshape(-1, 2)
    factors = np.ones(len(extents), dtype=np.int64)
    for factor in JPEG_REDUCTIONS[1:]:
        fits = (extents[:, 0] >= factor * need_hw[0]) & (extents[:, 1] >= factor * need_hw[1])
        factors[fits] = factor
    return factors


def reduction_for(source_hw: tuple[int, int] | None, min_side: int | None) -> int:
    """:func:`reduction_factors` for a whole image whose shorter side must stay at least
    ``min_side`` (1 when either is unknown)."""
    if source_hw is None or not min_side:
        return 1
    shorter = min(source_hw)
    # scalar arithmetic: called per image, where NumPy's per-call cost would dominate
    fitting = [f for f in JPEG_REDUCTIONS if shorter >= f * min_side]
    return fitting[-1] if fitting else 1


def decode_image(
    data: bytes | np.ndarray,
    *,
    min_side: int | None = None,
    grayscale: bool = False,
    exif_orientation: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    source: str = "<bytes>",
    damaged: list[DecodeError] | None = None,
) -> np.ndarray:
    """Decode an encoded image (JPEG, PNG, BMP, WebP, TIFF…) to uint8 pixels.

    Args:
        data: The encoded bytes.
        min_side: When given, JPEGs are decoded at the smallest 1/2, 1/4 or 1/8 scale
            whose shorter side is still at least this many pixels (other formats decode
            at full size). The caller resizes to the exact target afterwards.
        grayscale: Decode to one channel.
        exif_orientation: Rotate/flip as the EXIF orientation tag says (OpenCV's default).
            ``False`` keeps the stored orientation, like PIL and torchvision do by
            default, and keeps the pixels aligned with the frame header's size.
        max_pixels: Refuse an image whose header claims more pixels (``None``: no limit).
        source: Where the bytes came from, for the error message.
        damaged: ``None`` (default): a JPEG whose data is damaged (libjpeg warns, see
            :mod:`fastdata._turbojpeg`) is a ``DecodeError``. A list: such an image is
            decoded anyway and a ``DecodeError`` with ``kept=True`` describing the damage is
            appended to it (``on_error="warn"``).

    Returns:
        ``(H, W, 3)`` uint8 RGB, or ``(H, W)`` uint8 when ``grayscale``.

    Raises:
        DecodeError: The bytes are not a decodable image (corrupt, truncated, empty, or
            larger than ``max_pixels``), or a damaged JPEG when ``damaged`` is ``None``.
    """
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    header = jpeg_header(buf)
    if header is None and buf.size:
        try:
            check_pixels(image_size(buf), max_pixels, source)
        except DecodeError as exc:
            raise exc.with_source(source) from exc
    factor = reduction_for(None if header is None else (header.height, header.width), min_side)
    return decode_reduced(
        buf,
        header,
        factor,
        grayscale=grayscale,
        exif_orientation=exif_orientation,
        source=source,
        max_pixels=max_pixels,
        damaged=damaged,
    )


def decode_reduced(
    buf: np.ndarray,
    header: JpegHeader | None,
    factor: int,
    *,
    grayscale: bool,
    exif_orientation: bool,
    source: str,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    damaged: list[DecodeError] | None = None,
) -> np.ndarray:
    """:func:`decode_image` for callers that already parsed the header (``None``: not a
    JPEG) and chose the reduction ``factor`` (1, 2, 4 or 8; JPEGs only)."""
    if buf.size == 0:
        raise DecodeError("empty image data", source, "empty")
    if header is not None:
        check_pixels((header.height, header.width), max_pixels, source)
        # the smallest libjpeg scale that is at least 1/factor is 1/factor itself
        min_hw = (-(-header.height // factor), -(-header.width // factor))
        if header.components != 4:
            plan = JpegPlan(*min_hw, "GRAY" if grayscale else "RGB")
            fast = decode_turbo(buf, plan, source, damaged)
            if fast is not None:
                fast = fast[:, :, 0] if grayscale else fast
                return orient(fast, header.orientation) if exif_orientation else fast
        else:  # OpenCV converts CMYK/YCCK; its libjpeg would keep damaged data silently
            decode_turbo(buf, JpegPlan(*min_hw, "CMYK"), source, damaged)
    flag = (_REDUCED_GRAY if grayscale else _REDUCED_COLOR)[factor]
    if not exif_orientation:
        flag |= cv2.IMREAD_IGNORE_ORIENTATION
    try:
        image = cv2.imdecode(buf, flag)
    except cv2.error as exc:  # e.g. a size over OpenCV's own limit
        raise DecodeError(f"not a decodable image (OpenCV: {_first_line(exc)})", source) from exc
    if image is None:
        mode = None if header is not None else _wide_mode(buf)
        if mode is not None:
            raise DecodeError(wide_mode_message(mode), source, "not_an_image")
        raise DecodeError(
            "not a decodable image (corrupt, truncated or unknown format)",
            source,
            _undecodable_reason(buf),
        )
    if not grayscale and _COLOR_RGB is None:
        cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=image)
    return image


def _undecodable_reason(buf: np.ndarray) -> DecodeReason:
    """Why OpenCV decoded nothing, judged from the first and last bytes."""
    head, tail = buf[:8].tobytes(), buf[-8:].tobytes()
    for start, end in _FORMAT_ENDS.items():
        if head.startswith(start):
            return "corrupt" if tail.endswith(end) else "truncated"
    return "not_an_image"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
