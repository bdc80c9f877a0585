"""Sources as people have them: CSV variants, nested folders, OUT inside SRC, masks, .npy."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastdata import PreprocessOptions, load_manifest
from fastdata.cli import main
from fastdata.errors import PreprocessError
from fastdata.preprocess import SegmentationSource, preprocess
from fastdata.preprocess._runner import plan_tasks
from fastdata.preprocess._sources import SourceItem, SourceListing, list_source
from fastdata.preprocess._task import build_fields
from fastdata.shards import ShardReader

TINY = PreprocessOptions(sizes=(8,))


def _images(folder: Path, names: list[str], size: tuple[int, int] = (12, 10)) -> None:
    for i, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((*size, 3), 10 * i, np.uint8)).save(path)


def _labels(listing: Any) -> list[int]:
    return [item.label for item in listing.items]


# --- CSV/TSV lists -------------------------------------------------------------------------


def _twelve(tmp_path: Path) -> list[str]:
    names = [f"img{i}.png" for i in range(12)]
    _images(tmp_path, names)
    return names


def test_list_bom_and_header_keep_integer_labels(tmp_path: Path) -> None:
    names = _twelve(tmp_path)
    body = "".join(f"{n},{i}\n" for i, n in enumerate(names))
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbfpath,label\n" + body.encode())
    (tmp_path / "fc.csv").write_text("file,class\n" + body)
    (tmp_path / "bare.csv").write_bytes(b"\xef\xbb\xbf" + body.encode())
    for name in ("bom.csv", "fc.csv", "bare.csv"):
        listing = list_source(tmp_path / name)
        assert _labels(listing) == list(range(12)), name
        assert listing.class_names == []


def test_list_columns_extra_columns_and_tsv(tmp_path: Path) -> None:
    names = _twelve(tmp_path)
    rows = "".join(f"{i}\t{n}\tnote {i}\t{i % 3}\n" for i, n in enumerate(names))
    (tmp_path / "l.tsv").write_text("id\tjpg\tcomment\tcat\n" + rows)
    listing = list_source(tmp_path / "l.tsv", path_column="jpg", label_column="cat")
    assert [Path(it.path).name for it in listing.items] == names
    assert _labels(listing) == [i % 3 for i in range(12)]
    out = tmp_path / "o"
    args = ["preprocess", str(tmp_path / "l.tsv"), str(out), "--size", "8", "-q"]
    assert main([*args, "--path-column", "jpg", "--label-column", "cat"]) == 0
    assert ShardReader(out).read_batch("label", np.arange(12)).tolist() == _labels(listing)
    # a column that is not there is a clear error
    with pytest.raises(PreprocessError, match="--label-column 'klass' is not a column"):
        list_source(tmp_path / "l.tsv", path_column="jpg", label_column="klass")
    # several columns, none recognisable as the labels
    with pytest.raises(PreprocessError, match="cannot tell which column holds the labels"):
        list_source(tmp_path / "l.tsv", path_column="jpg")


def test_list_columns_given_by_number_read_every_row_of_a_list_without_header(
    tmp_path: Path,
) -> None:
    """A first row whose cell equals a column's number ("0") is data, not a header."""
    names = _twelve(tmp_path)
    (tmp_path / "l.tsv").write_text("".join(f"{i}\t{n}\n" for i, n in enumerate(names)))
    listing = list_source(tmp_path / "l.tsv", path_column="1", label_column="0")
    assert [Path(it.path).name for it in listing.items] == names
    assert _labels(listing) == list(range(12))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("n/a", r"row 8 has label 'n/a', not an integer, while row 1 has '0'"),
        ("", r"row 8 has an empty label"),
        ("-3", r"row 8 has label -3; labels must be integers in 0\.\.9223372036854775807$"),
        ("99999999999999999999", r"row 8 has label 99999999999999999999; labels must be int"),
        ("9223372036854775808", r"row 8 has label 9223372036854775808; labels must be int"),
    ],
)
def test_list_bad_label_is_an_error_naming_the_row(tmp_path: Path, bad: str, message: str) -> None:
    names = _twelve(tmp_path)
    labels = [str(i) for i in range(12)]
    labels[7] = bad
    rows = [f"{n},{lab}\n" for n, lab in zip(names, labels, strict=True)]
    (tmp_path / "l.csv").write_text("".join(rows))
    with pytest.raises(PreprocessError, match=message):
        list_source(tmp_path / "l.csv")
    assert main(["preprocess", str(tmp_path / "l.csv"), str(tmp_path / "o"), "-q"]) == 1


@pytest.mark.parametrize("spelling", ["img3.png", "./img3.png", "sub/../img3.png"])
def test_list_one_file_with_two_labels_is_an_error_naming_both_rows(
    tmp_path: Path, spelling: str, capsys: Any
) -> None:
    names = _twelve(tmp_path)
    rows = [f"{n},{i % 3}\n" for i, n in enumerate(names)] + [f"{spelling},2\n"]
    (tmp_path / "l.csv").write_text("path,label\n" + "".join(rows))
    message = (
        rf"{spelling!r} is listed in row 5 with label '0' and in row 14 with label '2'; a file "
        "has one label"
    )
    with pytest.raises(PreprocessError, match=message.replace(".", r"\.")):
        list_source(tmp_path / "l.csv")
    assert main(["preprocess", str(tmp_path / "l.csv"), str(tmp_path / "o"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "row 5 with label '0'" in err


def test_list_one_file_twice_with_one_label_is_kept_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = _twelve(tmp_path)
    rows = [f"{n},cat\n" for n in names] + ["./img3.png,cat\n", "img3.png,cat\n"]
    (tmp_path / "l.csv").write_text("".join(rows))
    with caplog.at_level(logging.WARNING, logger="fastdata.preprocess"):
        listing = list_source(tmp_path / "l.csv")
    assert len(listing.items) == 14  # stored as listed: a way to oversample
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'l.csv'}: 2 row(s) repeat a file listed earlier with the same label "
        "(e.g. './img3.png' in rows 4 and 13); each row is stored as a sample of its own"
    ]


def test_list_class_names_are_recorded_and_printed(tmp_path: Path, capsys: Any) -> None:
    names = _twelve(tmp_path)
    classes = ["dog", "cat", "bird"]
    (tmp_path / "l.csv").write_text(
        "image,category\n" + "".join(f"{n},{classes[i % 3]}\n" for i, n in enumerate(names))
    )
    out = tmp_path / "o"
    assert main(["preprocess", str(tmp_path / "l.csv"), str(out), "--size", "8", "-q"]) == 0
    assert "0=bird, 1=cat, 2=dog" in capsys.readouterr().out
    assert load_manifest(out).class_names == ["bird", "cat", "dog"]
    expected = [["bird", "cat", "dog"].index(classes[i % 3]) for i in range(12)]
    assert ShardReader(out).read_batch("label", np.arange(12)).tolist() == expected


# --- folders -------------------------------------------------------------------------------


def test_out_inside_src_is_not_listed_on_rerun(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _images(src, ["a/1.png", "a/2.png", "b/3.png"])
    out = src / "out"
    first = preprocess(src, out, TINY, show_progress=False)
    again = preprocess(src, out, TINY, overwrite=True, show_progress=False)
    assert first.num_samples == again.num_samples == 3
    assert load_manifest(out).class_names == ["a", "b"]
    # and a segmentation source written into its own image folder
    seg = tmp_path / "seg"
    _images(seg, ["x.png", "y.png"])
    (tmp_path / "m").mkdir()
    for stem in ("x", "y"):
        Image.fromarray(np.zeros((12, 10), np.uint8)).save(tmp_path / "m" / f"{stem}.png")
    preprocess(
        SegmentationSource(seg, masks=tmp_path / "m"),
        seg,
        TINY,
        show_progress=False,
        overwrite=True,
    )
    summary = preprocess(
        SegmentationSource(seg, masks=tmp_path / "m"),
        seg,
        TINY,
        overwrite=True,
        show_progress=False,
    )
    assert (summary.num_samples, summary.num_skipped) == (2, 0)


def test_images_in_sub_folders_belong_to_their_class(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _images(src, ["a/1.png", "a/sub/2.png", "a/sub/deeper/3.png", "a/sub-2/4.png", "b/5.png"])
    listing = list_source(src)
    # torchvision ImageFolder order: folders sorted by path, files by name within each
    assert [it.name for it in listing.items] == [
        "a/1.png",
        "a/sub/2.png",
        "a/sub-2/4.png",
        "a/sub/deeper/3.png",
        "b/5.png",
    ]
    assert _labels(listing) == [0, 0, 0, 0, 1]
    summary = preprocess(src, tmp_path / "o", TINY, show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (5, 0)


def test_non_utf8_file_name_is_listed_and_stored(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _images(src, ["a/ok.png"])
    raw = os.fsencode(src / "a") + b"/caf\xe9.png"
    with open(raw, "wb") as fh:
        fh.write((src / "a" / "ok.png").read_bytes())
    with open(os.fsencode(src / "a") + b"/bad\xff.png", "wb") as fh:
        fh.write(b"not an image")
    summary = preprocess(src, tmp_path / "o", TINY, show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (2, 1)
    reader = ShardReader(tmp_path / "o")
    names = sorted(bytes(reader.read("path", i)).decode() for i in range(2))
    assert names == ["a/caf\\xe9.png", "a/ok.png"]
    skipped = (tmp_path / "o" / "index.json").read_text()
    assert "bad\\\\xff.png" in skipped and "\\udc" not in skipped  # valid UTF-8 JSON


def test_unreadable_class_folder_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    _images(src, ["a/1.png", "b/2.png"])
    real_scandir = os.scandir
    locked = str(src / "b")

    def scandir(path: Any) -> Any:
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", locked)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PreprocessError, match=r"cannot list folder .*/b: Permission denied"):
        list_source(src)


# --- .npy ----------------------------------------------------------------------------------


def test_npy_big_endian_is_accepted_as_native(tmp_path: Path) -> None:
    src = tmp_path / "v"
    src.mkdir()
    little = np.arange(12, dtype="<u2").reshape(3, 4)
    np.save(src / "a.npy", little)
    np.save(src / "b.npy", (little + 1).astype(">u2"))
    summary = preprocess(src, tmp_path / "o", show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (2, 0)
    volumes = ShardReader(tmp_path / "o").read_batch("volume", np.arange(2))
    assert volumes.dtype == np.uint16
    np.testing.assert_array_equal(volumes[1], little + 1)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((0, 4), np.uint8), "is an empty array of shape"),
        (np.zeros(3, dtype=[("x", "u1"), ("y", "f4")]), "only plain bool, integer or float"),
    ],
)
def test_npy_empty_or_structured_is_a_clear_error(
    tmp_path: Path, array: np.ndarray, message: str
) -> None:
    src = tmp_path / "v"
    src.mkdir()
    np.save(src / "bad.npy", array)
    with pytest.raises(PreprocessError, match=message):
        preprocess(src, tmp_path / "o", show_progress=False)


# --- segmentation pairs --------------------------------------------------------------------


def test_mask_suffix_beside_images_and_in_own_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _images(src, ["a.jpg", "b.jpg"])
    for stem in ("a", "b"):
        Image.fromarray(np.ones((12, 10), np.uint8)).save(src / f"{stem}_mask.png")
    summary = preprocess(
        SegmentationSource(src, mask_suffix="_mask"), tmp_path / "o1", TINY, show_progress=False
    )
    assert (summary.num_samples, summary.num_skipped) == (2, 0)
    assert ShardReader(tmp_path / "o1").read("mask", 0).max() == 1
    masks = tmp_path / "masks"
    masks.mkdir()
    for stem in ("a", "b"):
        (src / f"{stem}_mask.png").rename(masks / f"{stem}_mask.png")
    args = ["preprocess", str(src), str(tmp_path / "o2"), "--size", "8", "-q"]
    assert main([*args, "--masks", str(masks), "--mask-suffix", "_mask"]) == 0
    assert load_manifest(tmp_path / "o2").num_samples == 2


def test_unpaired_images_and_masks_follow_on_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    images, masks = tmp_path / "i", tmp_path / "m"
    _images(images, ["a.jpg", "b.jpg", "c.jpg"])
    masks.mkdir()
    for stem in ("a", "b", "z"):
        Image.fromarray(np.zeros((12, 10), np.uint8)).save(masks / f"{stem}.png")
    summary = preprocess(
        SegmentationSource(images, masks=masks), tmp_path / "o", TINY, show_progress=False
    )
    assert (summary.num_samples, summary.num_skipped) == (2, 2)
    reasons = {Path(s["path"]).name: s["reason"] for s in load_manifest(tmp_path / "o").skipped}
    assert reasons["c.jpg"].startswith("image without a mask")
    assert reasons["z.png"].startswith("mask without an image")
    fail = PreprocessOptions(sizes=(8,), on_error="raise")
    with pytest.raises(PreprocessError, match=r"without an image, e\.g\. .*z\.png"):
        preprocess(
            SegmentationSource(images, masks=masks), tmp_path / "o2", fail, show_progress=False
        )
    warn = PreprocessOptions(sizes=(8,), on_error="warn")
    with caplog.at_level(logging.WARNING, logger="fastdata.preprocess"):
        preprocess(
            SegmentationSource(images, masks=masks), tmp_path / "o3", warn, show_progress=False
        )
    assert len(load_manifest(tmp_path / "o3").skipped) == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and any("z.png: mask without an image" in m for m in warned)


def test_default_shard_size_gives_several_shards_for_a_few_thousand_images() -> None:
    items = [SourceItem(f"/x/{i}.jpg", f"c/{i}.jpg", 0) for i in range(3000)]
    listing = SourceListing("imagefolder", "/x", items, ["c"])
    options = PreprocessOptions(sizes=(224,))
    tasks = plan_tasks(listing, build_fields(listing, options), options)
    assert len(tasks) >= 6  # shard-aware sampling windows and per-shard resume have units
    assert all(len(t.items) * 224 * 224 * 3 <= 64 << 20 for t in tasks)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--path-column", "x"], "--path-column/--label-column are for a CSV/TSV list"),
        (["--max-pixels", "-5"], "argument --max-pixels: must be a pixel count"),
        (["--mask-suffix="], "argument --mask-suffix: must be a non-empty part"),
        (["--kind", "npy", "--mask-suffix", "_m"], "--mask-suffix is for image + mask pairs"),
    ],
)
def test_new_flags_reject_bad_values_in_one_line(
    tmp_path: Path, capsys: Any, flags: list[str], message: str
) -> None:
    _images(tmp_path / "src", ["a/1.png"])
    try:
        code = main(["preprocess", str(tmp_path / "src"), str(tmp_path / "o"), "-q", *flags])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_list_first_row_with_a_class_called_label_is_data(tmp_path: Path) -> None:
    names = _twelve(tmp_path)
    classes = ["label", "y"]
    (tmp_path / "l.csv").write_text("".join(f"{n},{classes[i % 2]}\n" for i, n in enumerate(names)))
    listing = list_source(tmp_path / "l.csv")
    assert len(listing.items) == 12 and listing.class_names == ["label", "y"]


def test_files_beside_class_folders_are_recorded_not_dropped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _images(src, ["a/1.png", "stray.png"])
    summary = preprocess(src, tmp_path / "o", TINY, show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (1, 1)
    skipped = load_manifest(tmp_path / "o").skipped
    assert Path(skipped[0]["path"]).name == "stray.png"
    assert "not inside a class folder" in skipped[0]["reason"]
