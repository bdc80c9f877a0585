"""fastdata._lookup, the compiled per-channel lookups of the CPU ``gpu.Normalize``: built by
the install, every value its table's entry whatever the alignment of the output and the
length of the planes, bad buffers refused."""

from __future__ import annotations

import numpy as np
import pytest

try:
    from fastdata import _lookup
except ImportError:  # not built: the first test says so, the others skip
    _lookup = None  # type: ignore[assignment]


def test_the_compiled_lookups_are_built() -> None:
    # setup.py builds it optionally: an install that silently lost it would run the slower
    # OpenCV path everywhere
    assert _lookup is not None, "fastdata._lookup was not built: is a C compiler installed?"


def _tables(channels: int, dtype: type) -> np.ndarray:
    rng = np.random.default_rng(channels)
    bits = rng.integers(-(2**31), 2**31 - 1, (channels, 256), dtype=np.int64)
    return bits.astype(np.int32 if np.dtype(dtype).itemsize == 4 else np.int16).view(dtype)


@pytest.mark.skipif(_lookup is None, reason="fastdata._lookup not built")
@pytest.mark.parametrize("dtype", [np.float32, np.int16])
@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offset", [0, 1, 3])  # output starts 0, 1 or 3 values past a line
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (17, 19), (16, 16)])
def test_every_value_is_its_tables_entry(
    dtype: type, channels: int, interleaved: bool, offset: int, shape: tuple[int, int]
) -> None:
    rng = np.random.default_rng(0)
    height, width = shape
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    source = pixels if interleaved else np.ascontiguousarray(pixels.transpose(2, 0, 1))
    tables = _tables(channels, dtype)
    count = channels * height * width
    memory = np.full(count + offset + 8, 7, dtype)  # the values around the output stay
    out = memory[offset : offset + count].reshape(channels, height, width)
    _lookup.planes(source, tables, out, channels, interleaved)
    expected = np.stack([tables[c][pixels[..., c]] for c in range(channels)])
    assert np.array_equal(out.view(np.uint8), expected.view(np.uint8))
    assert (memory[:offset].view(np.uint8) == np.full(offset, 7, dtype).view(np.uint8)).all()
    assert (memory[offset + count :] == np.full(8, 7, dtype)).all()


@pytest.mark.skipif(_lookup is None, reason="fastdata._lookup not built")
def test_bad_buffers_are_refused() -> None:
    image = np.zeros((4, 4, 3), np.uint8)
    tables = np.zeros((3, 256), np.float32)
    out = np.zeros((3, 4, 4), np.float32)
    with pytest.raises(ValueError, match="out holds 188 bytes, the image needs 192"):
        _lookup.planes(image, tables, out.reshape(-1)[:47], 3, True)
    with pytest.raises(ValueError, match="tables hold 2048 bytes, 3 channels need 3072"):
        _lookup.planes(image, tables[:2], out, 3, True)
    with pytest.raises(TypeError, match="table entries must be 2 or 4 bytes, got 8"):
        _lookup.planes(image, tables.astype(np.float64), out, 3, True)
    with pytest.raises(TypeError, match="source must be uint8"):
        _lookup.planes(image.astype(np.int16), tables, out, 3, True)
    with pytest.raises(ValueError, match="does not hold 5 channels"):
        _lookup.planes(image, tables, out, 5, True)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _lookup.planes(image[:, ::2], tables, out, 3, True)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _lookup.planes(image, tables, out, 3, True)
