"""Every user error of the command line is one line, ``fastdata <cmd>: error: ...``, and exit
code 2 (a usage error) or 1 (the work failed): never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from fastdata.cli import main
from tests.tune.synthetic import write_tiny_shards


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``images/`` (an ImageFolder of 4 JPEGs), ``list.csv`` over them, ``masks/``."""
    root = tmp_path_factory.mktemp("cli-sources")
    rng = np.random.default_rng(0)
    (root / "images" / "a").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(4):
        image = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        cv2.imwrite(str(root / "images" / "a" / f"{index}.jpg"), image)
        cv2.imwrite(str(root / "masks" / f"{index}.png"), image[..., 0] % 3)
    (root / "list.csv").write_text(
        "path,label\n" + "".join(f"images/a/{i}.jpg,0\n" for i in range(4))
    )
    return root


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI expecting a usage error; return its one stderr line."""
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's own refusals
        code = exit_info.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fastdata {argv[0]}: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--size", "0"], "argument --size: must be a positive integer, got 0"),
        (["--size", "big"], "argument --size: must be a positive integer, got 'big'"),
        (["--size", "64", "64"], "--size values must be distinct, got 64 64"),
        (["--workers", "0"], "argument --workers: must be a positive integer, got 0"),
        (["--jpeg-quality", "101"], "argument --jpeg-quality: must be an integer in 1..100"),
        (["--jpeg-quality", "0"], "must be an integer in 1..100, got 0"),
        (["--resize", "longer"], "--resize longer keeps each image's aspect ratio"),
        (["--resize", "longer", "--storage", "raw"], "it needs --storage jpeg"),
        (
            ["--storage", "jpeg", "--compression", "gzip"],
            "--compression applies to --storage raw only, got --storage jpeg",
        ),
        (["--shard-mb", "nan"], "argument --shard-mb: must be a number > 0, got 'nan'"),
        (["--shard-mb", "inf"], "must be a number > 0, got 'inf'"),
        (["--shard-mb", "-5"], "argument --shard-mb: must be a number > 0, got -5"),
        (["--shard-mb", "0"], "must be a number > 0, got 0"),
        (["--shard-mb", "1e-9"], "--shard-mb must be at least one byte"),
        (
            ["--size", "100000"],
            "--size 100000: an output side of 100,000 pixels is over the largest, 65,535",
        ),
        (["--size", "1000000000", "--max-pixels", "0"], "side of 1,000,000,000 pixels is over"),
        (
            ["--size", "224", "10000"],
            "--size 10000: an output of 10000x10000 = 100,000,000 pixels is over the pixel "
            "limit that every image is held to, --max-pixels 89,478,485: use a smaller size",
        ),
        (["--size", "64", "--max-pixels", "4000"], "--max-pixels 4,000: use a smaller size"),
        (["--address", "auto"], "--address needs --engine ray"),
        (["--kind", "npy", "--masks", "MASKS"], "--masks is for image folders"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--on-error", "fail"],
            "argument --on-error: must be one of ('raise', 'warn', 'skip'), got 'fail' "
            "(now spelled 'raise')",
        ),
        (["--on-error", "ignore"], "must be one of ('raise', 'warn', 'skip'), got 'ignore'"),
    ],
)
def test_preprocess_rejects_bad_options(
    sources: Path,
    tmp_path: Path,
    options: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = [str(sources / "masks") if o == "MASKS" else o for o in options]
    out = tmp_path / "out"
    line = _usage_error(["preprocess", str(sources / "images"), str(out), "-q", *options], capsys)
    assert message in line
    assert not out.exists()  # refused before any work


def test_a_job_whose_every_input_fails_exits_1_in_one_line(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["preprocess", str(sources / "images"), str(out), "-q", "--size", "8"]
    assert main([*argv, "--max-pixels", "100"]) == 1  # every 24x20 input is over 100 pixels
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "fastdata preprocess: error: every input failed (4 of 4), so nothing was stored and "
        "index.json was not written; the first: "
    )
    assert "0.jpg: image header says 24x20 = 480 pixels, over the limit of 100" in err[0]
    assert not (out / "index.json").exists()


def test_masks_with_a_csv_source_is_a_usage_error(
    sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["preprocess", str(sources / "list.csv"), str(tmp_path / "o"), "-q"]
    line = _usage_error([*argv, "--masks", str(sources / "masks")], capsys)
    assert "--masks needs SRC to be a folder of images" in line and "list.csv" in line


def test_a_value_the_library_rejects_is_one_line_too(
    sources: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The library refusing the source (PreprocessError): the work failed, exit 1.
    argv = ["preprocess", str(sources / "images"), str(tmp_path / "o"), "-q"]
    assert main([*argv, "--kind", "list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastdata preprocess: error: a list source")
    # A ValueError from the library (a value the CLI let through): a usage error, one line.
    line = _usage_error([*argv, "--kind", "segmentation"], capsys)
    assert "--kind segmentation needs --masks" in line

    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("sizes must be one or more positive ints,\n  got (0,)")

    monkeypatch.setattr("fastdata.cli.preprocess.preprocess", refuse)
    line = _usage_error(argv, capsys)
    assert line == "fastdata preprocess: error: sizes must be one or more positive ints, got (0,)"


def test_tune_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = write_tiny_shards(tmp_path)
    line = _usage_error(["tune", str(shards), "--batch-size", "0"], capsys)
    assert "argument --batch-size: must be a positive integer, got 0" in line
    line = _usage_error(["tune", str(shards)], capsys)
    assert "the following arguments are required: --batch-size" in line
    line = _usage_error(["tune", str(shards), "--batch-size", "4", "--random-crop"], capsys)
    assert "--random-crop needs --crop SIZE" in line
    line = _usage_error(["tune", str(shards), "--batch-size", "4", "--fields", "nope"], capsys)
    assert "fields ['nope'] are not in the shard set" in line


def test_verify_a_corrupt_shard_is_a_failure_not_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = write_tiny_shards(tmp_path)
    shard = next(shards.glob("shard-*.h5"))
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(shards), "-q"]) == 1
    err = capsys.readouterr().err
    assert f"CORRUPT {shard.name}" in err and "Traceback" not in err
    assert main(["verify", str(tmp_path / "nowhere"), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastdata verify: error: ")
    assert main(["inspect", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastdata inspect: error: ")


def test_the_console_command_prints_no_traceback(sources: Path, tmp_path: Path) -> None:
    """The real process: stderr is the one line, the exit status 2."""
    command = ["preprocess", str(sources / "images"), str(tmp_path / "o"), "--shard-mb", "nan"]
    done = subprocess.run(
        [sys.executable, "-m", "fastdata", *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "fastdata preprocess: error: argument --shard-mb: must be a number > 0, got 'nan'\n"
    )


@pytest.mark.parametrize("url", ["az://bucket/set/", "ftp://host/set", "HTTPS://host/set/"])
def test_preprocess_refuses_a_url_of_an_unsupported_scheme(
    sources: Path,
    tmp_path: Path,
    url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # a URL taken for a path would create a folder here
    line = _usage_error(["preprocess", str(sources / "images"), url, "-q"], capsys)
    assert f"out {url!r} has the scheme" in line and "is not supported" in line
    assert list(tmp_path.iterdir()) == []
    line = _usage_error(["preprocess", url, str(tmp_path / "o"), "-q"], capsys)
    assert f"src {url!r} has the scheme" in line
    assert list(tmp_path.iterdir()) == []
