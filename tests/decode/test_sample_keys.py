"""A decoder's random crops keyed per image by ``(seed, epoch, dataset index)`` (``keys=``
of ``decode`` and ``decode_stream``), for every backend: the same crop for a sample
whatever the batch, its order, the batches decoded before, or the images refused in it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fastdata.decode import Decoder
from tests.decode.conftest import rgb_jpeg
from tests.decode.test_max_pixels import BACKENDS, _backend

IMAGES = [rgb_jpeg(40, 48, seed=s) for s in range(4)]  # 1,920 pixels each
INDICES = [10, 11, 12, 13]


def _seeded(name: str, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Decoder:
    return _backend(name, monkeypatch, random_crop=True, seed=7, **options)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_keyed_crop_depends_on_the_seed_epoch_and_index_only(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _seeded(name, monkeypatch).decode(IMAGES, keys=(3, INDICES)).images
    decoder = _seeded(name, monkeypatch)
    decoder.decode(IMAGES)  # its stream moves on: keyed draws do not
    reversed_batch = decoder.decode(IMAGES[::-1], keys=(3, INDICES[::-1])).images
    assert torch.equal(reversed_batch.flip(0), want)
    stream = decoder.decode_stream(
        [IMAGES[:1], IMAGES[1:]], keys=[(3, INDICES[:1]), (3, INDICES[1:])]
    )
    assert torch.equal(torch.cat([decoded.images for decoded in stream]), want)
    other_epoch = decoder.decode(IMAGES, keys=(4, INDICES)).images
    assert not torch.equal(other_epoch, want)
    unkeyed = [_seeded(name, monkeypatch).decode(IMAGES).images for _ in range(2)]
    assert torch.equal(unkeyed[0], unkeyed[1])  # the stream: seeded, in batch order
    assert not torch.equal(unkeyed[0], want)


@pytest.mark.parametrize("name", BACKENDS)
def test_an_image_refused_before_decoding_leaves_the_others_crops_alone(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _seeded(name, monkeypatch).decode(IMAGES, keys=(0, INDICES)).images
    big = rgb_jpeg(60, 80)  # 4,800 pixels
    decoder = _seeded(name, monkeypatch, on_error="skip", max_pixels=2000)
    batch = [IMAGES[0], big, *IMAGES[1:]]
    decoded = decoder.decode(batch, keys=(0, [INDICES[0], 99, *INDICES[1:]]))
    assert decoded.kept.tolist() == [0, 2, 3, 4]
    assert torch.equal(decoded.images, want)
    (streamed,) = decoder.decode_stream([batch], keys=[(0, [INDICES[0], 99, *INDICES[1:]])])
    assert torch.equal(streamed.images, want)


@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        ("ab", TypeError, r"keys must be None or a pair \(epoch, indices\)"),
        ((1.5, INDICES), TypeError, "keys must be None or a pair"),
        ((True, INDICES), TypeError, "keys must be None or a pair"),
        ((0, "abcd"), TypeError, "keys must be None or a pair"),
        ((0, [[10, 11], [12, 13]]), TypeError, "keys must be None or a pair"),
        ((0, [1.0, 2.0, 3.0, 4.0]), TypeError, "keys must be None or a pair"),
        ((0, INDICES[:3]), ValueError, "one index per encoded image: 4 images, got 3 indices"),
    ],
)
def test_keys_are_checked(keys: Any, error: type[Exception], match: str) -> None:
    decoder = _backend("cpu", pytest.MonkeyPatch(), random_crop=True, seed=7)
    with pytest.raises(error, match=match):
        decoder.decode(IMAGES, keys=keys)
    with pytest.raises(error, match=match):
        list(decoder.decode_stream([IMAGES], keys=[keys]))
