"""``ReadOptions``: one value, checked in one place, for every dataset and builder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fastdata.datasets import RAMDataset, ReadOptions, ShardDataset
from fastdata.decode import create_decoder
from fastdata.errors import OnError
from tests.datasets.conftest import Reference


def test_options_value_reads_like_the_keywords(raw_shards: Reference) -> None:
    options = ReadOptions(layout="HWC", on_error="skip", num_threads=2, max_pixels=0)
    builders = {
        "shard": lambda **kw: ShardDataset(raw_shards.path, **kw),
        "ram-shards": lambda **kw: RAMDataset.from_shards(
            raw_shards.path, show_progress=False, **kw
        ),
        "ram-arrays": lambda **kw: RAMDataset.from_arrays(
            raw_shards.images, raw_shards.labels, **kw
        ),
    }
    for name, build in builders.items():
        by_value = build(options=options)
        by_keywords = build(layout="HWC", on_error="skip", num_threads=2, max_pixels=0)
        for dataset in (by_value, by_keywords):
            assert dataset.options == options, name
            assert (dataset.layout, dataset.on_error) == ("HWC", OnError.SKIP), name
            assert (dataset.num_threads, dataset.max_pixels) == (2, None), name
        images, _ = by_value.__getitems__([0, 1])
        assert images.shape[1:] == raw_shards.images.shape[1:], name
        np.testing.assert_array_equal(images.numpy(), raw_shards.images[:2])


def test_options_are_normalised_and_frozen() -> None:
    options = ReadOptions(on_error="warn", max_pixels=0)
    assert options.on_error is OnError.WARN and options.max_pixels is None
    assert options.decodes and options.crop_decode is None
    assert not ReadOptions(decode=False).decodes
    decoded = ReadOptions(decode=create_decoder("cpu", size=16))
    assert decoded.crop_decode is not None and decoded.crop_decode.size == (16, 16)
    with pytest.raises(AttributeError):
        options.layout = "HWC"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"layout": "NCHW"}, ValueError, "layout must be one of"),
        ({"on_error": "ignore"}, ValueError, "on_error must be one of"),
        ({"num_threads": 0}, ValueError, "num_threads must be a positive int or None, got 0"),
        ({"max_pixels": -1}, ValueError, "max_pixels must be a positive int"),
        ({"decode_min_side": 0}, ValueError, "decode_min_side must be a positive int"),
        ({"decode": "yes"}, TypeError, "decode must be True, False or a fastdata.decode"),
        ({"roles": ["mask"]}, TypeError, "roles must be a mapping"),
    ],
)
def test_every_dataset_refuses_bad_options_before_reading(
    raw_shards: Reference, arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ReadOptions(**arguments)  # type: ignore[arg-type]
    missing = raw_shards.path / "missing"  # refused before any file is opened
    with pytest.raises(error, match=message):
        ShardDataset(missing, **arguments)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        RAMDataset.from_shards(missing, **arguments)
    if "roles" not in arguments:  # image files have no fields to give roles to
        with pytest.raises(error, match=message):
            RAMDataset([missing / "a.jpg"], [0], **arguments)  # type: ignore[arg-type]


def test_options_and_keywords_together_are_refused(raw_shards: Reference) -> None:
    options = ReadOptions(layout="HWC")
    with pytest.raises(TypeError, match="on_error given both in options= and as keywords"):
        ShardDataset(raw_shards.path, on_error="skip", options=options)
    with pytest.raises(TypeError, match="num_threads given both in options="):
        RAMDataset.from_arrays(raw_shards.images, options=options, num_threads=2)
    with pytest.raises(TypeError, match="options must be a ReadOptions, got dict"):
        ShardDataset(raw_shards.path, options={"layout": "HWC"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keyword",
    [
        {"layout": "CHW"},
        {"decode": True},
        {"decode_min_side": None},
        {"on_error": "raise"},
        {"num_threads": None},
        {"max_pixels": ReadOptions().max_pixels},
        {"roles": None},
    ],
    ids=lambda keyword: next(iter(keyword)),
)
def test_a_keyword_at_its_default_value_with_options_is_refused(
    raw_shards: Reference, image_files: tuple[list[Path], Reference], keyword: dict[str, object]
) -> None:
    # ReadOptions(layout="HWC") with layout="CHW" must not silently read HWC
    options = ReadOptions(layout="HWC", on_error="skip", num_threads=2)
    name = next(iter(keyword))
    message = f"^{name} given both in options= and as keywords"
    builders: dict[str, Callable[..., object]] = {
        "shard": lambda **kw: ShardDataset(raw_shards.path, **kw),
        "ram-shards": lambda **kw: RAMDataset.from_shards(
            raw_shards.path, show_progress=False, **kw
        ),
        "ram-arrays": lambda **kw: RAMDataset.from_arrays(raw_shards.images, **kw),
    }
    if name != "roles":  # image files have no fields to give roles to
        paths = image_files[0]
        builders["ram-files"] = lambda **kw: RAMDataset(paths, None, show_progress=False, **kw)
    for build in builders.values():
        with pytest.raises(TypeError, match=message):
            build(options=options, **keyword)
        assert build(options=options).options == options  # options alone: used as given
        assert build(**keyword).options == ReadOptions(**keyword)  # type: ignore[arg-type]
