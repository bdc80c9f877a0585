"""Bad input: every case ends with one clear message and nothing half-written."""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from fastdata import PreprocessOptions, load_manifest
from fastdata.cli import main
from fastdata.errors import OnError, PreprocessError
from fastdata.preprocess import SegmentationSource, preprocess
from fastdata.shards import ShardReader, ShardWriter
from tests.decode.conftest import damaged_jpeg, rgb_jpeg

TINY = PreprocessOptions(sizes=(16,))


def _leftovers(out: Path) -> list[str]:
    return (
        sorted(p.name for p in out.iterdir() if p.name != ".fastdata-job") if out.exists() else []
    )


@pytest.fixture
def damaged_folder(sample_imagefolder: Path) -> Path:
    """The tiny ImageFolder plus a truncated JPEG, a text file and an empty file."""
    good = sorted(sample_imagefolder.glob("class_000/*.jpg"))[0].read_bytes()
    (sample_imagefolder / "class_000" / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (sample_imagefolder / "class_001" / "notes.txt").write_text("not an image")
    (sample_imagefolder / "class_002" / "empty.jpg").write_bytes(b"")
    return sample_imagefolder


def test_skip_reports_and_records_bad_files(damaged_folder: Path, tmp_path: Path) -> None:
    summary = preprocess(damaged_folder, tmp_path / "o", TINY, workers=2, show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (24, 3)
    skipped = load_manifest(tmp_path / "o").skipped
    assert sorted(Path(s["path"]).name for s in skipped) == [
        "empty.jpg",
        "notes.txt",
        "truncated.jpg",
    ]
    assert all(s["reason"] for s in skipped)


def test_truncated_jpeg_is_skipped_not_stored_as_garbage(tmp_path: Path, sample_tool: Any) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    data = sample_tool.make_image(0, 1, (64, 48))
    (src / "cut.jpg").write_bytes(data[:200])
    (src / "ok.jpg").write_bytes(data)
    summary = preprocess(tmp_path / "src", tmp_path / "o", TINY, show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (1, 1)


def test_fail_mode_stops_naming_the_file(damaged_folder: Path, tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(16,), on_error="raise")
    with pytest.raises(PreprocessError, match=r"truncated\.jpg.*--on-error skip"):
        preprocess(damaged_folder, tmp_path / "o", options, workers=2, show_progress=False)
    assert not (tmp_path / "o" / "index.json").exists()
    assert [n for n in _leftovers(tmp_path / "o") if not n.startswith("shard-")] == []


def test_cli_fail_mode_exit_code(damaged_folder: Path, tmp_path: Path, capsys: Any) -> None:
    code = main(
        [
            "preprocess",
            str(damaged_folder),
            str(tmp_path / "o"),
            "--size",
            "16",
            "--on-error",
            "raise",
            "-q",
        ]
    )
    assert code == 1
    assert "truncated.jpg" in capsys.readouterr().err  # the first bad file in sample order
    assert not (tmp_path / "o" / "index.json").exists()


@pytest.mark.parametrize("spelling", ["raise", OnError.RAISE])
def test_raise_as_string_or_member_is_one_policy(
    damaged_folder: Path, tmp_path: Path, spelling: OnError | str
) -> None:
    options = PreprocessOptions(sizes=(16,), on_error=spelling)
    assert options.on_error is OnError.RAISE and options.to_json()["on_error"] == "raise"
    with pytest.raises(PreprocessError, match=r"truncated\.jpg.*--on-error skip"):
        preprocess(damaged_folder, tmp_path / "o", options, show_progress=False)


def test_warn_logs_each_skipped_input_and_skip_does_not(
    damaged_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for policy in ("warn", "skip"):
        caplog.clear()
        options = PreprocessOptions(sizes=(16,), on_error=policy)
        with caplog.at_level(logging.DEBUG, logger="fastdata.preprocess"):
            summary = preprocess(
                damaged_folder, tmp_path / policy, options, workers=2, show_progress=False
            )
        assert summary.num_skipped == 3  # recorded under either policy
        reports = [
            (r.levelno, r.getMessage())
            for r in caplog.records
            if r.getMessage().startswith("skipped a sample: ")
        ]
        level = logging.WARNING if policy == "warn" else logging.DEBUG
        assert [lvl for lvl, _ in reports] == [level] * 3
        assert any("truncated.jpg" in message for _, message in reports)
        assert load_manifest(tmp_path / policy).options["on_error"] == policy


@pytest.mark.parametrize(("spelling", "code"), [("warn", 0), ("skip", 0), ("raise", 1)])
def test_cli_accepts_every_policy(
    damaged_folder: Path, tmp_path: Path, spelling: str, code: int
) -> None:
    out = tmp_path / "o"
    args = ["preprocess", str(damaged_folder), str(out), "--size", "16", "-q"]
    assert main([*args, "--on-error", spelling]) == code
    if code == 0:
        assert load_manifest(out).options["on_error"] == spelling


def test_cli_skip_mode_summary(damaged_folder: Path, tmp_path: Path, capsys: Any) -> None:
    code = main(["preprocess", str(damaged_folder), str(tmp_path / "o"), "--size", "16", "-q"])
    assert code == 0
    captured = capsys.readouterr()
    assert "24 samples in 1 shard(s)" in captured.out and "skipped 3" in captured.out


def test_empty_source(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "src" / "empty_class").mkdir(parents=True)
    with pytest.raises(PreprocessError, match="source has no inputs"):
        preprocess(tmp_path / "src", tmp_path / "o", show_progress=False)
    assert main(["preprocess", str(tmp_path / "src"), str(tmp_path / "o"), "-q"]) == 1
    assert "source has no inputs" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_missing_source(tmp_path: Path, capsys: Any) -> None:
    with pytest.raises(PreprocessError, match="source does not exist"):
        preprocess(tmp_path / "nope", tmp_path / "o", show_progress=False)
    assert main(["preprocess", str(tmp_path / "nope"), str(tmp_path / "o"), "-q"]) == 1
    assert "source does not exist" in capsys.readouterr().err


def test_unwritable_out(sample_imagefolder: Path, tmp_path: Path, capsys: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PreprocessError, match="not a folder"):
        preprocess(sample_imagefolder, blocker, TINY, show_progress=False)
    with pytest.raises(PreprocessError, match="cannot write to output folder"):
        preprocess(sample_imagefolder, blocker / "sub", TINY, show_progress=False)
    assert main(["preprocess", str(sample_imagefolder), str(blocker / "sub"), "-q"]) == 1
    assert "cannot write to output folder" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_out(sample_imagefolder: Path, tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(PreprocessError, match="cannot write to output folder"):
            preprocess(sample_imagefolder, parent / "o", TINY, show_progress=False)
    finally:
        parent.chmod(0o700)


def test_full_disk_leaves_nothing_half_written(
    sample_imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    original = ShardWriter.append

    def append(self: ShardWriter, sample: Any) -> None:
        if self.num_samples == 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, sample)

    monkeypatch.setattr(ShardWriter, "append", append)
    out = tmp_path / "o"
    with pytest.raises(PreprocessError, match="No space left on device"):
        preprocess(sample_imagefolder, out, TINY, workers=2, show_progress=False)
    assert _leftovers(out) == []
    assert main(["preprocess", str(sample_imagefolder), str(out), "--size", "16", "-q"]) == 1
    assert "No space left on device" in capsys.readouterr().err
    monkeypatch.setattr(ShardWriter, "append", original)
    assert preprocess(sample_imagefolder, out, TINY, show_progress=False).num_samples == 24


def _segmentation(tmp_path: Path, images: list[str], masks: list[str]) -> tuple[Path, Path]:
    image_dir, mask_dir = tmp_path / "img", tmp_path / "mask"
    image_dir.mkdir(), mask_dir.mkdir()
    for name in images:
        cv2.imwrite(str(image_dir / f"{name}.png"), np.zeros((8, 8, 3), np.uint8))
    for name in masks:
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(mask_dir / f"{name}.png")
    return image_dir, mask_dir


def test_mask_without_image(tmp_path: Path, capsys: Any) -> None:
    images, masks = _segmentation(tmp_path, ["a"], ["a", "b"])
    fail = PreprocessOptions(on_error="raise")
    with pytest.raises(PreprocessError, match=r"1 mask\(s\) without an image, e.g. .*b\.png"):
        preprocess(
            SegmentationSource(images, masks=masks), tmp_path / "o", fail, show_progress=False
        )
    args = ["preprocess", str(images), str(tmp_path / "o"), "--masks", str(masks), "-q"]
    args.extend(["--on-error", "raise"])
    assert main(args) == 1
    assert "without an image" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_image_without_mask(tmp_path: Path) -> None:
    images, masks = _segmentation(tmp_path, ["a", "c"], ["a"])
    fail = PreprocessOptions(on_error="raise")
    with pytest.raises(PreprocessError, match=r"image\(s\) without a mask, e.g. .*c\.png"):
        preprocess(
            SegmentationSource(images, masks=masks), tmp_path / "o", fail, show_progress=False
        )


def test_mask_of_wrong_size_is_skipped(tmp_path: Path) -> None:
    images, masks = _segmentation(tmp_path, ["a", "b"], ["a", "b"])
    Image.fromarray(np.zeros((4, 8), np.uint8)).save(masks / "b.png")
    summary = preprocess(
        SegmentationSource(images, masks=masks), tmp_path / "o", TINY, show_progress=False
    )
    assert summary.num_skipped == 1
    assert (
        "mask is (4, 8), its image is (8, 8)" in load_manifest(tmp_path / "o").skipped[0]["reason"]
    )


def test_cli_mismatched_npy_exit_code(tmp_path: Path, capsys: Any) -> None:
    src = tmp_path / "v"
    src.mkdir()
    np.save(src / "a.npy", np.zeros((2, 2), np.uint8))
    np.save(src / "b.npy", np.zeros((2, 2), np.uint16))
    assert main(["preprocess", str(src), str(tmp_path / "o"), "-q"]) == 1
    assert "mismatched .npy arrays" in capsys.readouterr().err


def test_malformed_list_row(tmp_path: Path) -> None:
    listing = tmp_path / "l.csv"
    listing.write_text("a.jpg,1\nb.jpg\n")
    with pytest.raises(
        PreprocessError, match="row 2 must have a path in column 0 and a label in column 1"
    ):
        preprocess(listing, tmp_path / "o", show_progress=False)


def test_different_options_refuse_non_empty_out(sample_imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    preprocess(sample_imagefolder, out, TINY, show_progress=False)
    other = PreprocessOptions(sizes=(8,))
    with pytest.raises(PreprocessError, match=r"holds the output of another job.*--overwrite"):
        preprocess(sample_imagefolder, out, other, show_progress=False)
    assert ShardReader(out).field("image").shape == (16, 16, 3)
    preprocess(sample_imagefolder, out, other, overwrite=True, show_progress=False)
    assert ShardReader(out).field("image").shape == (8, 8, 3)


def test_foreign_files_refuse(sample_imagefolder: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(PreprocessError, match=r"holds other files \('mine\.txt'"):
        preprocess(sample_imagefolder, out, TINY, show_progress=False)
    assert main(["preprocess", str(sample_imagefolder), str(out), "-q", "--overwrite"]) == 0
    assert (out / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sizes": ()}, "sizes must be one or more positive ints"),
        ({"sizes": (16, 16)}, "sizes must be distinct"),
        ({"resize": "crop"}, "resize must be one of"),
        ({"storage": "png"}, "storage must be one of"),
        ({"resize": "longer"}, "storage='raw' needs one fixed size"),
        ({"compression": "zstd"}, "compression must be None or one of"),
        ({"compression": "gzip", "storage": "jpeg"}, "compression applies to storage='raw'"),
        ({"jpeg_quality": 0}, "jpeg_quality must be an int in 1..100"),
        ({"shard_bytes": 0}, "shard_bytes must be a positive int"),
        ({"on_error": "ignore"}, "on_error must be one of"),
    ],
)
def test_option_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PreprocessOptions(**kwargs)


def test_argument_validation(sample_imagefolder: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="options must be a PreprocessOptions, got dict"):
        preprocess(sample_imagefolder, tmp_path / "o", {"sizes": 16})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers must be a positive int, got 0"):
        preprocess(sample_imagefolder, tmp_path / "o", workers=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'masks'"):
        preprocess(sample_imagefolder, tmp_path / "o", masks=tmp_path)  # type: ignore[call-arg]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_damaged_jpeg_is_an_error_skipped_or_kept_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, workers: int
) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "damaged.jpg").write_bytes(damaged_jpeg())
    (src / "ok.jpg").write_bytes(rgb_jpeg(64, 96))
    strict = PreprocessOptions(sizes=(16,), on_error="raise")
    with pytest.raises(PreprocessError, match=r"damaged\.jpg: corrupt or truncated JPEG \(Corr"):
        preprocess(
            tmp_path / "src", tmp_path / "raise", strict, workers=workers, show_progress=False
        )
    skipped = preprocess(
        tmp_path / "src", tmp_path / "skip", TINY, workers=workers, show_progress=False
    )
    assert (skipped.num_samples, skipped.num_skipped) == (1, 1)
    assert [Path(s["path"]).name for s in load_manifest(tmp_path / "skip").skipped] == [
        "damaged.jpg"
    ]
    keeping = PreprocessOptions(sizes=(16,), on_error="warn")
    with caplog.at_level(logging.WARNING, logger="fastdata.preprocess"):
        kept = preprocess(
            tmp_path / "src", tmp_path / "warn", keeping, workers=workers, show_progress=False
        )
    assert (kept.num_samples, kept.num_skipped) == (2, 0)
    reports = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(reports) == 1 and re.match(r"kept a damaged sample: .*: .*damaged\.jpg$", reports[0])
