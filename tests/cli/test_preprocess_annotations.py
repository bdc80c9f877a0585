"""``fastdata preprocess IMAGES OUT --coco/--yolo/--voc/--annotations``: the options' usage
errors and failures, each one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.cli import main
from tests.preprocess.test_annotations import write_image


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], code: int) -> str:
    try:
        returned = main(argv)
    except SystemExit as exit_info:  # argparse's own refusals
        returned = exit_info.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert returned == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastdata preprocess: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--coco", "i.json", "--yolo", "y"], "argument --yolo: not allowed with argument --coco"),
        (["--coco", "i.json", "--classes", "c.txt"], "--classes names the classes of --yolo"),
        (["--classes", "c.txt"], "--classes names the classes of --yolo, --voc or --annotations"),
        (["--yolo", "labels", "--masks", "m"], "--masks: not with --yolo (SRC is the image folder"),
        (["--voc", "xml", "--kind", "imagefolder"], "--kind: not with --voc"),
        (["--annotations", "x", "--from-python"], "--from-python: not with --annotations"),
    ],
)  # fmt: skip
def test_annotation_options_refuse_what_does_not_go_with_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    line = _one_line_error(
        ["preprocess", str(tmp_path), str(tmp_path / "out"), *options], capsys, 2
    )
    assert message in line, line


def test_unreadable_annotations_fail_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_image(tmp_path / "images" / "a.jpg", 8, 8)
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("")
    (tmp_path / "mixed" / "a.xml").write_text("<annotation/>")
    out = str(tmp_path / "out")
    images = str(tmp_path / "images")
    line = _one_line_error(
        ["preprocess", images, out, "--annotations", str(tmp_path / "mixed")], capsys, 1
    )
    assert "holds 1 .txt and 1 .xml files: say which format they are (--yolo or --voc" in line
    line = _one_line_error(
        ["preprocess", images, out, "--coco", str(tmp_path / "none.json")], capsys, 1
    )
    assert "COCO annotation file does not exist" in line
    (tmp_path / "bad.json").write_text("{")
    line = _one_line_error(
        ["preprocess", images, out, "--annotations", str(tmp_path / "bad.json")], capsys, 1
    )
    assert "bad.json is not valid JSON" in line
    line = _one_line_error(
        ["preprocess", images, out, "--yolo", images, "--classes", str(tmp_path / "c.txt")],
        capsys,
        1,
    )
    assert "cannot read class names from" in line


def test_a_bad_annotation_under_on_error_raise_stops_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_image(tmp_path / "images" / "a.jpg", 8, 8)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 nan\n")
    argv = ["preprocess", str(tmp_path / "images"), str(tmp_path / "out"), "--yolo",
            str(tmp_path / "labels"), "--on-error", "raise", "--size", "8"]  # fmt: skip
    line = _one_line_error(argv, capsys, 1)
    assert (
        "bad annotation: " in line and "a.txt: line 1: box 'cx cy w h' = '0.5 0.5 0.2 nan'" in line
    )
    assert not (tmp_path / "out" / "index.json").exists()


def test_detection_annotations_letterbox_by_default(tmp_path: Path) -> None:
    from fastdata.shards import load_manifest  # noqa: PLC0415
    from tests.detection_sets import painted_photos, write_yolo  # noqa: PLC0415

    photos = painted_photos(tmp_path / "images", num_images=3)
    labels = write_yolo(photos, tmp_path / "labels")
    base = ["preprocess", str(photos.images), "--size", "40", "--workers", "1", "-q"]
    assert main([*base[:2], str(tmp_path / "boxes"), *base[2:], "--yolo", str(labels)]) == 0
    assert load_manifest(tmp_path / "boxes").options["resize"] == "pad"  # no box cut off
    write_image(tmp_path / "classes" / "a" / "x.jpg", 8, 8)  # an ImageFolder
    plain = ["preprocess", str(tmp_path / "classes"), str(tmp_path / "plain"), *base[2:]]
    assert main(plain) == 0
    assert load_manifest(tmp_path / "plain").options["resize"] == "shorter"
