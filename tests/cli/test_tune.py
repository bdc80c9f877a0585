"""``fastdata tune PATH --batch-size N`` on a tiny shard set."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from fastdata import PreprocessOptions
from fastdata.cli import main
from fastdata.cli.tune import default_fields
from fastdata.preprocess import SegmentationSource, preprocess
from fastdata.shards import load_manifest
from tests.tune.synthetic import write_tiny_shards


@pytest.fixture
def shard_set(tmp_path: Path) -> Path:
    return write_tiny_shards(tmp_path)


@pytest.mark.parametrize("extra", [[], ["--in-memory", "--step-ms", "1"]])
def test_prints_the_table_and_the_recommendation(
    shard_set: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", str(shard_set), "--batch-size", "8", "--time-budget", "3", "--max-workers", "1"]
    assert main([*argv, "--no-progress", *extra]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["configuration", "batches/s"]
    assert "in-process" in out and "1 worker, prefetch 2" in out
    assert "recommended   num_workers=" in out
    assert "why           Reading one batch of 8" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-size", "0"], "must be a positive integer, got 0"),
        (["--batch-size", "4", "--time-budget", "0"], "must be a number > 0, got 0"),
        (["--batch-size", "4", "--step-ms", "-1"], "must be a number >= 0, got -1"),
        (["--batch-size", "4", "--max-workers", "-2"], "must be an integer >= 0, got -2"),
    ],
)
def test_rejects_bad_options(
    shard_set: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", str(shard_set), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_shard_set_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(tmp_path / "nowhere"), "--batch-size", "4"]) == 1
    assert "fastdata tune: error:" in capsys.readouterr().err


def _images(root: Path, count: int = 24, masks: Path | None = None) -> Path:
    """``count`` JPEGs of different sizes: an ImageFolder (one class), or with ``masks`` a
    flat image folder and PNG masks matched by stem."""
    rng = np.random.default_rng(0)
    folder = root if masks is not None else root / "a"
    folder.mkdir(parents=True)
    if masks is not None:
        masks.mkdir(parents=True)
    for index in range(count):
        image = rng.integers(0, 256, (20 + index % 5, 24 + index % 3, 3), dtype=np.uint8)
        cv2.imwrite(str(folder / f"{index}.jpg"), image)
        if masks is not None:
            cv2.imwrite(str(masks / f"{index}.png"), image[..., 0] % 4)
    return root


TUNE = ["--batch-size", "4", "--time-budget", "2", "--max-workers", "1", "-q"]


def test_variable_size_jpeg_sets_need_crop_and_tune_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _images(tmp_path / "src")
    out = tmp_path / "jpeg"
    options = PreprocessOptions(sizes=(24,), storage="jpeg", resize="longer")
    preprocess(src, out, options, workers=1, show_progress=False)
    assert main(["tune", str(out), *TUNE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("fastdata tune: error: the images of")
    assert "add --crop SIZE" in err[0]
    for crop in (["--crop", "16"], ["--crop", "16", "--random-crop"]):
        assert main(["tune", str(out), *TUNE, *crop]) == 0, capsys.readouterr().err
        assert "recommended   num_workers=" in capsys.readouterr().out


def test_fields_come_from_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _images(tmp_path / "images", masks=tmp_path / "masks")
    out = tmp_path / "seg"
    options = PreprocessOptions(sizes=(16, 8))
    preprocess(
        SegmentationSource(src, masks=tmp_path / "masks"),
        out,
        options,
        workers=1,
        show_progress=False,
    )
    manifest = load_manifest(out)
    assert {"image", "image_8", "mask", "mask_8", "path"} <= {f.name for f in manifest.fields}
    assert default_fields(manifest) == ["image", "mask"]
    # A segmentation set has no `label`: the former default fields failed here.
    assert main(["tune", str(out), *TUNE]) == 0, capsys.readouterr().err
    assert "recommended   num_workers=" in capsys.readouterr().out
    assert main(["tune", str(out), *TUNE, "--fields", "image_8"]) == 0


def test_one_spelling_of_quiet_and_the_former_one_still_works(
    shard_set: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", str(shard_set), "--batch-size", "8", "--time-budget", "1"]
    for quiet in ("-q", "--quiet", "--no-progress"):
        assert main([*argv, "--max-workers", "0", quiet]) == 0
        assert "autotune" not in capsys.readouterr().err  # no progress bar
