from __future__ import annotations

import io
import struct

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from fastdata import _codec as codec
from fastdata._codec import (
    JpegHeader,
    decode_image,
    decode_reduced,
    image_size,
    jpeg_header,
    jpeg_size,
    orient,
    pil_pixels,
    reduction_factors,
    reduction_for,
)
from fastdata.errors import DecodeError
from tests.decode.conftest import damaged_jpeg, encode, exif_rotated_jpeg, rgb_jpeg, smooth_rgb


def _jpeg(height: int, width: int, quality: int = 95) -> tuple[np.ndarray, bytes]:
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([xx % 256, yy % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)
    ok, enc = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    assert ok
    return rgb, enc.tobytes()


def test_jpeg_size_reads_header() -> None:
    _, data = _jpeg(375, 500)
    assert jpeg_size(data) == (375, 500)
    assert jpeg_size(np.frombuffer(data, np.uint8)) == (375, 500)
    assert jpeg_size(b"\x89PNG....") is None
    assert jpeg_size(data[:3]) is None


@pytest.mark.parametrize(
    ("hw", "min_side", "factor"),
    [((375, 500), 224, 1), ((375, 500), 180, 2), ((1000, 800), 101, 4), ((4000, 3000), 100, 8),
     ((375, 500), None, 1), (None, 10, 1)],
)  # fmt: skip
def test_reduction_keeps_min_side(
    hw: tuple[int, int] | None, min_side: int | None, factor: int
) -> None:
    assert reduction_for(hw, min_side) == factor


def test_one_reduction_rule_for_whole_images_and_crop_boxes() -> None:
    """Decoding a whole image for ``min_side`` and a crop box for an output size pick the
    scale by one rule: the largest 1/f at which the region still spans the pixels needed,
    so the resize after it never enlarges (a 449-pixel side is not halved for 225)."""
    assert reduction_for((449, 600), 225) == 1
    assert reduction_for((450, 600), 225) == 2
    for shorter in range(1, 1200, 7):
        for need in (1, 50, 111, 224):
            factor = reduction_for((shorter, shorter + 5), need)
            box = reduction_factors(np.array([[shorter, shorter]]), (need, need))[0]
            assert factor == box
            assert factor == 1 or shorter / factor >= need
            assert factor == 8 or shorter / (2 * factor) < need


def test_decode_is_rgb_and_reduced() -> None:
    rgb, data = _jpeg(400, 600)
    full = decode_image(data)
    assert full.shape == (400, 600, 3) and full.dtype == np.uint8
    assert np.abs(full.astype(int) - rgb).mean() < 3  # RGB order, JPEG-close
    reduced = decode_image(data, min_side=100)
    assert reduced.shape == (100, 150, 3)
    assert decode_image(data, grayscale=True).shape == (400, 600)


@pytest.mark.parametrize("bad", [b"", b"not an image", "truncated"])
def test_decode_errors_name_the_source(bad: bytes | str) -> None:
    data = _jpeg(64, 64)[1][:200] if bad == "truncated" else bad
    assert isinstance(data, bytes)
    with pytest.raises(DecodeError, match=r"photo\.jpg"):
        decode_image(data, source="photo.jpg")


def _gray_jpeg() -> bytes:
    return encode(Image.fromarray(smooth_rgb(48, 64)[..., 0]), quality=95)


def _cmyk_jpeg() -> bytes:
    return encode(Image.fromarray(smooth_rgb(48, 64)).convert("CMYK"), quality=95)


def test_jpeg_header_reports_components_and_exif() -> None:
    assert jpeg_header(rgb_jpeg(30, 40)) == JpegHeader(30, 40, 3, False)
    assert jpeg_header(exif_rotated_jpeg(30, 40)) == JpegHeader(30, 40, 3, True, 6)
    assert jpeg_header(_cmyk_jpeg()) == JpegHeader(48, 64, 4, False)
    assert jpeg_header(_gray_jpeg()) == JpegHeader(48, 64, 1, False)


@pytest.mark.parametrize("factor", [1, 2, 4, 8])
@pytest.mark.parametrize("grayscale", [False, True])
def test_fast_jpeg_path_gives_opencvs_bytes(
    factor: int, grayscale: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # simplejpeg and OpenCV are both libjpeg-turbo with its default IDCT and upsampling
    for name, encoded in [("color", rgb_jpeg(120, 160)), ("large", rgb_jpeg(480, 640, seed=2)),
                          ("gray", _gray_jpeg())]:  # fmt: skip
        data = np.frombuffer(encoded, np.uint8)
        reduced = "" if factor == 1 else "REDUCED_"
        suffix = "" if factor == 1 else f"_{factor}"
        flag = getattr(cv2, f"IMREAD_{reduced}{'GRAYSCALE' if grayscale else 'COLOR'}{suffix}")
        reference = cv2.imdecode(data, flag)
        if not grayscale:
            reference = cv2.cvtColor(reference, cv2.COLOR_BGR2RGB)
        with monkeypatch.context() as patch:  # the fast path must not fall back to OpenCV
            patch.setattr(codec.cv2, "imdecode", None)
            fast = decode_reduced(
                data,
                jpeg_header(data),
                factor,
                grayscale=grayscale,
                exif_orientation=True,
                source="",
            )
        assert fast.shape == reference.shape and np.array_equal(fast, reference), name


def test_exif_orientation_is_applied_unless_declined() -> None:
    data = exif_rotated_jpeg(30, 40)
    assert decode_image(data).shape == (40, 30, 3)  # rotated for display, as OpenCV does
    assert decode_image(data, exif_orientation=False).shape == (30, 40, 3)


def test_cmyk_jpeg_decodes_to_rgb() -> None:
    rgb = decode_image(_cmyk_jpeg())
    assert rgb.shape == (48, 64, 3)
    assert np.abs(rgb.astype(int) - smooth_rgb(48, 64)).mean() < 4


def _with_orientation(rgb: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "JPEG", quality=95, exif=exif)
    return buffer.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_matches_opencv_and_pil(orientation: int) -> None:
    yy, xx = np.mgrid[0:30, 0:40]
    rgb = np.stack([xx * 6, yy * 8, (xx + yy) * 3], axis=-1).astype(np.uint8)
    data = _with_orientation(rgb, orientation)
    header = jpeg_header(data)
    assert header is not None and header.orientation == orientation
    ours = decode_image(data)
    assert ours.shape[:2] == header.oriented_hw
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(ours, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    pil = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    np.testing.assert_array_equal(ours, np.asarray(pil))
    stored = decode_image(data, exif_orientation=False)
    np.testing.assert_array_equal(orient(stored, orientation), ours)


def test_corrupt_jpeg_data_is_an_error_but_stray_bytes_are_not() -> None:
    good = rgb_jpeg(48, 64)
    sof = good.index(b"\xff\xc0")
    claims_more = bytearray(good)
    claims_more[sof + 5 : sof + 9] = struct.pack(">HH", 480, 640)  # data for 48x64 only
    with pytest.raises(DecodeError, match="corrupt or truncated JPEG"):
        decode_image(bytes(claims_more))
    dht = good.index(b"\xff\xc4")
    stray = good[:dht] + b"\x00\x00\x00" + good[dht:]  # libjpeg: "extraneous bytes"
    np.testing.assert_array_equal(decode_image(stray), decode_image(good))


def test_max_pixels_reads_the_header_of_any_format() -> None:
    png = encode(Image.fromarray(smooth_rgb(30, 40)), fmt="PNG")
    bmp = encode(Image.fromarray(smooth_rgb(30, 40)), fmt="BMP")
    for data in (rgb_jpeg(30, 40), png, bmp):
        assert image_size(data) == (30, 40)
        assert decode_image(data, max_pixels=1200).shape[:2] == (30, 40)
        with pytest.raises(DecodeError, match=r"40x30 = 1,200 pixels, over the limit of 1,199"):
            decode_image(data, max_pixels=1199, source="x")
    assert image_size(b"not an image at all") is None


def test_decode_errors_say_why_in_reason() -> None:
    good = rgb_jpeg(48, 64)
    png = encode(Image.fromarray(smooth_rgb(30, 40)), fmt="PNG")
    sof = good.index(b"\xff\xc0")
    claims_more = bytearray(good)
    claims_more[sof + 5 : sof + 9] = struct.pack(">HH", 480, 640)  # data for 48x64 only
    no_tables = good[:2] + good[good.index(b"\xff\xda") :]  # scan data, no frame header
    cases = {
        "empty": b"",
        "not_an_image": b"not an image at all",
        "truncated": good[: len(good) // 2],
        "corrupt": bytes(claims_more),
    }
    cases_by_opencv = {"truncated": png[: len(png) // 2], "corrupt": no_tables}
    for expected, data in [*cases.items(), *cases_by_opencv.items()]:
        with pytest.raises(DecodeError) as caught:
            decode_image(data, source="x.jpg")
        assert (caught.value.reason, caught.value.source) == (expected, "x.jpg"), data[:16]
    for data in (good, png):
        with pytest.raises(DecodeError, match="over the limit") as caught:
            decode_image(data, max_pixels=1000, source="big")
        assert caught.value.reason == "too_large" and caught.value.source == "big"
        assert str(caught.value) == f"{caught.value.message}: big"


def test_sixteen_bit_pixels_keep_their_high_byte_decoded_or_handed_over_as_pil() -> None:
    gray = np.random.default_rng(3).integers(0, 65536, (9, 11), dtype=np.uint16)
    encoded = cv2.imencode(".png", gray)[1].tobytes()
    pil = Image.open(io.BytesIO(encoded))
    assert pil.mode == "I;16"
    expected = (gray >> 8).astype(np.uint8)
    np.testing.assert_array_equal(decode_image(encoded, grayscale=True), expected)
    np.testing.assert_array_equal(pil_pixels(pil), expected)
    big_endian = Image.frombuffer("I;16B", (11, 9), gray.astype(">u2").tobytes())
    np.testing.assert_array_equal(pil_pixels(big_endian), expected)


@pytest.mark.parametrize("mode", ["I", "F"])
def test_wide_images_are_refused_naming_the_mode(mode: str) -> None:
    pixels = np.full((6, 5), 3, np.int32 if mode == "I" else np.float32)
    stream = io.BytesIO()
    Image.fromarray(pixels).save(stream, format="TIFF")
    message = rf"PIL mode {mode} \(32-bit .*\) has no one 8-bit reading"
    with pytest.raises(DecodeError, match=rf"{message}.*: wide\.tiff$") as caught:
        decode_image(stream.getvalue(), source="wide.tiff")
    assert caught.value.reason == "not_an_image"
    with pytest.raises(ValueError, match=message):
        pil_pixels(Image.open(stream))


def test_damaged_entropy_data_is_an_error_or_kept_and_reported(
    capfd: pytest.CaptureFixture[str],
) -> None:
    data = damaged_jpeg()
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) is not None
    capfd.readouterr()  # OpenCV decoded it, printing libjpeg's warning
    with pytest.raises(DecodeError, match=r"Corrupt JPEG data: .*: x\.jpg$") as caught:
        decode_image(data, source="x.jpg")
    assert caught.value.reason == "corrupt" and not caught.value.kept
    damaged: list[DecodeError] = []
    for min_side in (None, 16):  # full size, and a reduced decode
        image = decode_image(data, source="x.jpg", damaged=damaged, min_side=min_side)
        assert image.shape == ((64, 96, 3) if min_side is None else (16, 24, 3))
    assert [(error.kept, error.reason, error.source) for error in damaged] == [
        (True, "corrupt", "x.jpg")
    ] * 2
    assert "Corrupt JPEG data" not in capfd.readouterr().err  # nothing printed on stderr
    good: list[DecodeError] = []
    decode_image(rgb_jpeg(48, 64), damaged=good)
    assert good == []


def test_a_damaged_cmyk_jpeg_is_judged_as_any_other() -> None:
    data = damaged_jpeg(mode="CMYK")
    with pytest.raises(DecodeError, match=r"Corrupt JPEG data: .*: x\.jpg$"):
        decode_image(data, source="x.jpg")
    damaged: list[DecodeError] = []
    image = decode_image(data, source="x.jpg", damaged=damaged)  # OpenCV converts CMYK
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(image, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    assert [error.kept for error in damaged] == [True]
    cmyk = encode(Image.fromarray(smooth_rgb(30, 40)).convert("CMYK"))
    assert decode_image(cmyk, damaged=damaged).shape == (30, 40, 3) and len(damaged) == 1
