"""Source records: ``preprocess(record, out, options)`` reads the kind the record names, with
that kind's options; a plain path is read as the kind it looks like."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastdata import PreprocessOptions, load_manifest
from fastdata.preprocess import (
    FileListSource,
    ImageFolderSource,
    NpyFolderSource,
    SegmentationSource,
    Source,
    preprocess,
)
from fastdata.shards import ShardReader

TINY = PreprocessOptions(sizes=(8,))


def _image(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 10, 3), value, np.uint8)).save(path)


def _run(src: Any, out: Path) -> ShardReader:
    preprocess(src, out, TINY, workers=1, show_progress=False)
    return ShardReader(out)


def test_a_file_list_reads_the_columns_it_names(tmp_path: Path) -> None:
    for i in range(4):
        _image(tmp_path / f"img{i}.png", 40 * i)
    rows = "".join(f"{i}\timg{i}.png\t{(i * 7) % 3}\n" for i in range(4))
    (tmp_path / "l.tsv").write_text("id\tjpg\tcat\n" + rows)
    by_name = _run(FileListSource(tmp_path / "l.tsv", "jpg", "cat"), tmp_path / "a")
    assert by_name.read_batch("label", np.arange(4)).tolist() == [0, 1, 2, 0]
    assert load_manifest(tmp_path / "a").source["kind"] == "list"
    # 0-based column numbers, as ints, in a list without a header: the ids as the labels
    (tmp_path / "bare.tsv").write_text(rows)
    by_number = _run(
        FileListSource(str(tmp_path / "bare.tsv"), path_column=1, label_column=0), tmp_path / "b"
    )
    assert by_number.read_batch("label", np.arange(4)).tolist() == [0, 1, 2, 3]


def test_a_record_names_the_kind_a_path_would_be_read_as_otherwise(tmp_path: Path) -> None:
    """A folder holding a ``.npy`` file reads as an array folder by its look; the
    ImageFolder record reads its class folders (the stray array recorded, not dropped)."""
    src = tmp_path / "src"
    for label, name in enumerate(("cat", "dog")):
        _image(src / name / "a.png", 50 * label)
    np.save(src / "stray.npy", np.zeros((2, 2), np.uint8))
    reader = _run(ImageFolderSource(src), tmp_path / "folder")
    assert reader.read_batch("label", np.arange(2)).tolist() == [0, 1]
    manifest = load_manifest(tmp_path / "folder")
    assert manifest.source["kind"] == "imagefolder" and manifest.class_names == ["cat", "dog"]
    assert [Path(entry["path"]).name for entry in manifest.skipped] == ["stray.npy"]
    _run(src, tmp_path / "by-look")  # the plain path: the array folder
    assert load_manifest(tmp_path / "by-look").source["kind"] == "npy"


def test_array_and_segmentation_records(tmp_path: Path) -> None:
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    for i in range(3):
        np.save(arrays / f"v{i}.npy", np.full((2, 3, 4), i, np.int16))
    reader = _run(NpyFolderSource(arrays), tmp_path / "npy")
    assert reader.read("volume", 2).tolist() == np.full((2, 3, 4), 2, np.int16).tolist()
    images, masks = tmp_path / "images", tmp_path / "masks"
    for i in range(2):
        _image(images / f"s{i}.png", 10)
        masks.mkdir(exist_ok=True)
        Image.fromarray(np.full((12, 10), i + 1, np.uint8)).save(masks / f"s{i}.png")
    reader = _run(SegmentationSource(images, masks=masks), tmp_path / "seg")
    assert [int(reader.read("mask", i).max()) for i in range(2)] == [1, 2]


def test_every_record_is_a_source_and_frozen(tmp_path: Path) -> None:
    record = SegmentationSource(tmp_path, mask_suffix="_mask")
    assert isinstance(record, Source) and record.kind == "segmentation"
    with pytest.raises(AttributeError):
        record.masks = tmp_path  # type: ignore[misc]
    assert FileListSource("l.csv") == FileListSource("l.csv")


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: ImageFolderSource(3), TypeError, r"path must be a path \(str or os.PathLike\)"),
        (lambda: NpyFolderSource(""), ValueError, "path must be a non-empty path, got ''"),
        (lambda: SegmentationSource("images/"), ValueError, "needs masks .* or mask_suffix"),
        (
            lambda: SegmentationSource("images/", mask_suffix="a/b"),
            ValueError,
            "mask_suffix must be a non-empty file-name part such as '_mask', got 'a/b'",
        ),
        (
            lambda: FileListSource("l.csv", path_column=1.5),
            TypeError,
            r"path_column must be a header name \(str\) or a column number \(int\), got 1.5",
        ),
        (
            lambda: FileListSource("l.csv", label_column=-1),
            ValueError,
            "label_column must be a 0-based column number >= 0, got -1",
        ),
    ],
)
def test_bad_records_are_refused_in_one_line(
    make: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()


def test_a_record_of_an_unsupported_url_or_remote_kind_is_refused(tmp_path: Path) -> None:
    # object storage holds ImageFolder trees and lists (tests/storage); other URLs and kinds
    # are refused in one line before any request
    with pytest.raises(ValueError, match="scheme ftp://, which is not supported"):
        preprocess(ImageFolderSource("ftp://host/photos"), tmp_path / "o", TINY)
    with pytest.raises(ValueError, match="kind 'npy' must be a local folder"):
        preprocess(NpyFolderSource("s3://bucket/arrays"), tmp_path / "o", TINY)
    with pytest.raises(ValueError, match="segmentation source must be a local folder"):
        preprocess(SegmentationSource("s3://bucket/images", masks="m"), tmp_path / "o", TINY)
