"""Annotation sources through preprocessing: COCO, YOLO and VOC folders to shards whose boxes
are the painted boxes letterboxed to the stored size (worked out by hand), bad annotations
recorded or refused by the job's ``on_error``, and a resume that notices changed boxes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fastdata.cli import main
from fastdata.datasets import ShardDataset
from fastdata.errors import PreprocessError
from fastdata.preprocess import (
    CocoDetection,
    PreprocessOptions,
    VocDetection,
    YoloDetection,
    preprocess,
)
from fastdata.shards import load_manifest
from tests.detection_sets import (
    COLOURS,
    DetectionSet,
    letterboxed,
    painted_photos,
    write_coco,
    write_voc,
    write_yolo,
)

SIDE = 40  # 80x60 and 60x80 photos scale by 1/2: whole-pixel boxes


@pytest.fixture
def photos(tmp_path: Path) -> DetectionSet:
    return painted_photos(tmp_path / "images")


def check_letterboxed_boxes(out: Path, photos: DetectionSet) -> None:
    dataset = ShardDataset(out, fields=("image", "boxes", "labels"))
    assert dataset.class_names == list(COLOURS)
    images, boxes, labels = dataset.__getitems__(list(range(len(photos.boxes))))
    assert images.shape == (12, 3, SIDE, SIDE) and images.dtype == torch.uint8
    for index, expected in enumerate(letterboxed(photos, SIDE)):
        assert boxes[index].dtype == torch.float32 and labels[index].dtype == torch.int64
        np.testing.assert_allclose(boxes[index].numpy(), expected, atol=1e-4)
        np.testing.assert_array_equal(labels[index].numpy(), photos.labels[index])
        if len(expected):  # the box painted last is whole: its colour fills it
            x1, y1, x2, y2 = expected[-1].astype(int)
            inside = images[index, :, y1 + 1 : y2 - 1, x1 + 1 : x2 - 1].permute(1, 2, 0).int()
            colour = torch.tensor(list(COLOURS.values())[photos.labels[index][-1]])
            assert ((inside - colour).abs().amax(-1) < 40).float().mean() > 0.9


@pytest.mark.parametrize("fmt", ["coco", "yolo", "voc"])
def test_each_format_stores_boxes_letterboxed_to_the_stored_size(
    tmp_path: Path, photos: DetectionSet, fmt: str
) -> None:
    if fmt == "coco":
        source = CocoDetection(photos.images, write_coco(photos, tmp_path / "i.json"))
    elif fmt == "yolo":
        source = YoloDetection(photos.images, write_yolo(photos, tmp_path / "labels"))
    else:
        source = VocDetection(photos.images, write_voc(photos, tmp_path / "xml"), list(COLOURS))
    options = PreprocessOptions(sizes=(SIDE,), resize="pad")
    summary = preprocess(source, tmp_path / "out", options, workers=2, show_progress=False)
    assert summary.num_samples == 12 and summary.num_skipped == 0
    check_letterboxed_boxes(tmp_path / "out", photos)
    fields = {spec.name: spec.role for spec in load_manifest(tmp_path / "out").fields}
    flag = {"coco": "iscrowd", "voc": "difficult", "yolo": None}[fmt]
    assert fields["boxes"] == "boxes" and fields["labels"] == "box_labels"
    assert (flag in fields) if flag else set(fields) == {"image", "boxes", "labels", "path"}


@pytest.mark.parametrize(
    ("flag", "make"),
    [
        ("--coco", lambda photos, root: write_coco(photos, root / "instances.json")),
        ("--yolo", lambda photos, root: write_yolo(photos, root / "labels")),
        ("--voc", lambda photos, root: write_voc(photos, root / "xml")),
        ("--annotations", lambda photos, root: write_coco(photos, root / "instances.json")),
        ("--annotations", lambda photos, root: write_yolo(photos, root / "labels")),
        ("--annotations", lambda photos, root: write_voc(photos, root / "xml")),
    ],
)
def test_the_command_line_reads_each_format(
    tmp_path: Path,
    photos: DetectionSet,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    make: object,
) -> None:
    annotations = make(photos, tmp_path)  # type: ignore[operator]
    classes = ["--classes", str(tmp_path / "names.txt")] if annotations.name == "xml" else []
    (tmp_path / "names.txt").write_text("red\ngreen\nblue\n")
    argv = ["preprocess", str(photos.images), str(tmp_path / "out"), flag, str(annotations),
            *classes, "--size", str(SIDE), "--resize", "pad", "--workers", "1", "-q"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "12 samples in 1 shard(s)" in out and "skipped 0" in out
    assert "labels (class names; 'class_names' in index.json): 0=red, 1=green, 2=blue" in out
    check_letterboxed_boxes(tmp_path / "out", photos)


def test_bad_annotations_are_recorded_or_stop_the_job(tmp_path: Path, photos: DetectionSet) -> None:
    path = write_coco(photos, tmp_path / "i.json")
    data = json.loads(path.read_text())
    data["annotations"][0]["bbox"][2] = 500  # past image 101's 60 pixels
    data["annotations"].append({"id": 99, "image_id": 7, "bbox": [0, 0, 2, 2], "category_id": 1})
    path.write_text(json.dumps(data))
    source = CocoDetection(photos.images, path)
    with pytest.raises(
        PreprocessError, match=r"bad annotation: .*img_001.jpg: i.json image id 101"
    ):
        preprocess(source, tmp_path / "out", PreprocessOptions(sizes=(SIDE,), on_error="raise"))
    assert not (tmp_path / "out" / "index.json").exists()
    summary = preprocess(
        source, tmp_path / "out", PreprocessOptions(sizes=(SIDE,)), workers=1, show_progress=False
    )
    assert summary.num_samples == 11 and summary.num_skipped == 2
    skipped = load_manifest(tmp_path / "out").skipped
    assert skipped[0]["path"] == str(photos.images / "img_001.jpg")
    assert "annotation id 1 (annotations[0]): bbox [" in skipped[0]["reason"]
    assert "lies past the 60x80 image" in skipped[0]["reason"]
    assert skipped[1] == {
        "path": str(path),
        "reason": f"annotation id 99 (annotations[{len(data['annotations']) - 1}]) refers to "
        "image_id 7, not in 'images'",
    }


def test_a_rerun_notices_a_changed_box_of_an_unprobed_image(
    tmp_path: Path, photos: DetectionSet
) -> None:
    path = write_coco(photos, tmp_path / "i.json")
    options = PreprocessOptions(sizes=(SIDE,), resize="pad")
    preprocess(CocoDetection(photos.images, path), tmp_path / "out", options, workers=1)
    data = json.loads(path.read_text())
    # image 102 is neither the first, the middle nor the last image (the probed items)
    box = next(a for a in data["annotations"] if a["image_id"] == 102)
    box["bbox"][0] += 2
    path.write_text(json.dumps(data))
    with pytest.raises(PreprocessError, match="overwrite"):
        preprocess(CocoDetection(photos.images, path), tmp_path / "out", options, workers=1)


def test_a_missing_photo_or_a_wrong_annotated_size_is_a_counted_skip(
    tmp_path: Path, photos: DetectionSet
) -> None:
    path = write_coco(photos, tmp_path / "i.json")
    data = json.loads(path.read_text())
    data["images"][3]["width"] = 81  # img_003.jpg is 80x60
    path.write_text(json.dumps(data))
    (photos.images / "img_005.jpg").unlink()
    options = PreprocessOptions(sizes=(SIDE,), resize="pad")
    summary = preprocess(CocoDetection(photos.images, path), tmp_path / "out", options, workers=1)
    assert summary.num_samples == 10 and summary.num_skipped == 2
    reasons = {entry["path"]: entry["reason"] for entry in load_manifest(tmp_path / "out").skipped}
    assert reasons["dataset[3]"].startswith("the image is 80x60, but its annotation says 81x60")
    assert reasons["dataset[5]"].startswith("cannot read (FileNotFoundError")
